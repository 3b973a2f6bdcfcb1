r"""How tensors transform: the representation attached to each input and output.

A :class:`Rep` knows three things about a tensor: how a rotation (proper or
improper, ``Q`` with ``det Q = +-1``) acts on it, whether it is indexed by
atoms along dim 0 (so an atom permutation reorders it), and how to split it
into degree components for error reports.

=================  ==========================  ==================================
name               tensor                      action of ``Q``
=================  ==========================  ==================================
``"irreps"``       ``[N, K, C]`` (our layout)  ``D(Q) x``; degree l has parity (-1)^l
``"scalar"``       any                         unchanged
``"vector"``       ``[..., 3]`` (polar)        ``v Q^T`` (forces, dipoles, edge vectors)
``"position"``     ``[N, 3]``                  ``p Q^T``; also translated
``"rank2"``        ``[..., 3, 3]``             ``Q S Q^T`` (stress); split into l = 0, 1, 2
``"atom_index"``   long, values are atoms      relabelled under permutations
``"batch"``        long ``[N]`` graph index    permuted, values kept
e3nn ``Irreps``    ``[N, irreps.dim]``         ``Irreps.D_from_matrix(Q)`` (float64, see below)
=================  ==========================  ==================================

``D`` for our layout is the checker's own :func:`reference_wigner_D` of the
proper part ``Q det(Q)`` times ``det(Q)^l`` (parity (-1)^l, like e3nn's
spherical harmonics ``0e + 1o + 2e + ...``). It is built without Euler angles
and without :func:`est.so3.wigner_D` (the code under test): each degree block
is the least-squares solution of ``Y_l(Q v_i) = D_l(Q) Y_l(v_i)`` over fixed
points ``v_i``, with e3nn's spherical harmonics (e3nn's real basis is ours),
so it is accurate to rounding for every rotation, the poles included. For e3nn
irreps the same blocks are used with each irrep's own parity: this equals
``Irreps.D_from_matrix(Q)``, which itself would raise false alarms: its Euler
angles lose accuracy near the pole (2e-9 at 1e-9 rad from it, float64) and it
builds constants in torch's default dtype (2e-7 everywhere when that is float32).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from est.so3 import lmax_from_num_coefficients, spherical_harmonics

__all__ = ["Rep", "as_rep", "REP_NAMES", "reference_wigner_D"]

REP_NAMES = ("irreps", "scalar", "vector", "position", "rank2", "atom_index", "batch", "graph_scalar")


@contextlib.contextmanager
def single_thread():
    """Run the checker's own small tensor ops on one thread (restored afterwards).

    Intra-op parallelism on tiny tensors costs milliseconds per op on a busy
    machine (thread wake-ups); the model under test keeps its own settings.
    """
    old = torch.get_num_threads()
    if old == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


#: e3nn's spherical harmonics stop at this degree; above it the checker uses est.so3's
_E3NN_MAX_L = 12


def _harmonics(lmax: int, v: torch.Tensor) -> torch.Tensor:
    """Real spherical harmonics ``[n, K]`` of unit vectors ``v [n, 3]`` (float64), e3nn's when it has them."""
    if lmax <= _E3NN_MAX_L:
        from e3nn import o3

        return o3.spherical_harmonics(list(range(lmax + 1)), v, normalize=False, normalization="component")
    return spherical_harmonics(lmax, v, normalize=False, validate=False)


@functools.lru_cache(maxsize=16)
def _fit_points(lmax: int) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    r"""Fixed unit vectors ``v [n, 3]`` and the pseudo-inverses ``P_l [2l+1, n]`` of ``Y_l(v)``.

    ``n = 4 (2 lmax + 1) + 8`` seeded random points: every ``Y_l(v)`` has full
    column rank with a condition number below 3 (measured up to lmax = 20;
    checked), so ``D_l(R)^T = P_l Y_l(R v)`` is exact to rounding.
    """
    g = torch.Generator().manual_seed(20240607)
    n = 4 * (2 * lmax + 1) + 8
    v = torch.randn(n, 3, generator=g, dtype=torch.float64)
    v = v / v.norm(dim=1, keepdim=True)  # [n, 3]
    Y = _harmonics(lmax, v)  # [n, K]
    pinvs = []
    for l in range(lmax + 1):
        Yl = Y[:, l * l : (l + 1) ** 2]  # [n, 2l+1]
        cond = float(torch.linalg.cond(Yl))
        if not cond < 10:  # pragma: no cover - a property of the fixed seed
            raise RuntimeError(f"reference_wigner_D: ill-conditioned fit points at l={l} (cond {cond:.1e})")
        pinvs.append(torch.linalg.pinv(Yl))  # [2l+1, n]
    return v, tuple(pinvs)


def reference_wigner_D(lmax: int, R: torch.Tensor) -> torch.Tensor:
    r"""The checker's own ``D(R)`` ``[K, K]`` (float64) for a rotation ``R [3, 3]``.

    Independent of :func:`est.so3.wigner_D` (no Euler angles, no shared
    factorisation): with fixed points ``v_i`` and ``Y = Y(v) [n, K]``,

    .. math:: Y_l(v R^T) = Y_l(v)\, D_l(R)^T \;\Rightarrow\; D_l(R)^T = Y_l(v)^{+}\, Y_l(v R^T),

    exact to rounding for every rotation because ``Y_l(v)`` has full column
    rank. Harmonics are e3nn's (the same real basis as est's) up to degree
    12, est.so3's above.
    """
    R = R.detach().to(torch.float64).cpu()
    return _reference_wigner_D(lmax, tuple(R.reshape(-1).tolist())).clone()


@functools.lru_cache(maxsize=8)
def _reference_wigner_D(lmax: int, R_flat: tuple[float, ...]) -> torch.Tensor:
    """Cached by value: a check transforms several outputs with the same rotation."""
    R = torch.tensor(R_flat, dtype=torch.float64).reshape(3, 3)
    v, pinvs = _fit_points(lmax)
    YR = _harmonics(lmax, v @ R.T)  # [n, K]
    blocks = [(P @ YR[:, l * l : (l + 1) ** 2]).T for l, P in enumerate(pinvs)]  # [2l+1, 2l+1] each
    return torch.block_diag(*blocks)


class Rep:
    """Representation of one tensor (see the module docstring).

    Args:
        kind: one of :data:`REP_NAMES` or ``"e3nn"``.
        irreps: the e3nn ``Irreps`` (kind ``"e3nn"`` only).
        per_atom: dim 0 is the atom index (permuted with the atoms).
            ``None``: decided from the tensor (dim 0 equals the number of atoms).
    """

    def __init__(self, kind: str, *, irreps: Any = None, per_atom: bool | None = None) -> None:
        if kind not in REP_NAMES + ("e3nn",):
            raise ValueError(f"unknown representation {kind!r}; expected one of {REP_NAMES} or an e3nn Irreps")
        self.kind = kind
        self.irreps = irreps
        self.per_atom = per_atom
        if kind in ("position", "batch"):
            self.per_atom = True
        if kind == "graph_scalar":
            self.per_atom = False

    def __repr__(self) -> str:
        return f"Rep({self.irreps})" if self.kind == "e3nn" else f"Rep({self.kind!r})"

    @property
    def label(self) -> str:
        return str(self.irreps) if self.kind == "e3nn" else self.kind

    # ------------------------------------------------------------------ action
    def transform(self, t: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
        """Apply the (proper or improper) orthogonal ``Q [3, 3]`` (float64) to ``t``."""
        with single_thread():
            return self._transform(t, Q)

    def _transform(self, t: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.Tensor) or self.kind in ("scalar", "graph_scalar", "atom_index", "batch"):
            return t
        Qt = Q.to(dtype=t.dtype, device=t.device)
        if self.kind in ("vector", "position"):
            if t.shape[-1] != 3:
                raise ValueError(f"a {self.kind!r} tensor needs a last dimension of 3, got shape {tuple(t.shape)}")
            return t @ Qt.T
        if self.kind == "rank2":
            if t.shape[-2:] != (3, 3):
                raise ValueError(f"a 'rank2' tensor needs trailing shape (3, 3), got {tuple(t.shape)}")
            return Qt @ t @ Qt.T
        if self.kind == "irreps":
            D = self.matrix(Q, t).to(dtype=t.dtype, device=t.device)  # [K, K]
            return torch.einsum("ij,...jc->...ic", D, t)
        D = self.matrix(Q, t).to(dtype=t.dtype, device=t.device)  # [dim, dim]
        return t @ D.T

    def matrix(self, Q: torch.Tensor, t: torch.Tensor | None = None) -> torch.Tensor:
        """The float64 representation matrix of ``Q`` (``"irreps"`` and ``"e3nn"`` kinds)."""
        Q = Q.to(torch.float64).cpu()
        if self.kind == "irreps":
            lmax = self.lmax(t)
            det = float(torch.linalg.det(Q))
            sign = 1.0 if det > 0 else -1.0
            D = reference_wigner_D(lmax, sign * Q)  # [K, K]
            if sign < 0:
                par = torch.tensor([(-1.0) ** l for l in range(lmax + 1) for _ in range(2 * l + 1)], dtype=torch.float64)
                D = D * par[:, None]
            return D
        if self.kind == "e3nn":
            # e3nn's Irreps.D_from_matrix loses accuracy near the pole and in a float32 default
            # dtype (false alarms at our tolerance, see the module docstring); its blocks equal
            # reference_wigner_D's (same real basis), so assemble D from those and the parities.
            det = float(torch.linalg.det(Q))
            sign = 1.0 if det > 0 else -1.0
            lmax = max((ir.l for _, ir in self.irreps), default=0)
            full = reference_wigner_D(lmax, sign * Q)  # [K, K]
            blocks = []
            for mul, ir in self.irreps:
                block = full[ir.l * ir.l : (ir.l + 1) ** 2, ir.l * ir.l : (ir.l + 1) ** 2]
                if sign < 0 and ir.p == -1:
                    block = -block
                blocks += [block] * mul
            if not blocks:
                return torch.zeros(0, 0, dtype=torch.float64)
            return torch.block_diag(*blocks)
        raise TypeError(f"no representation matrix for kind {self.kind!r}")

    def lmax(self, t: torch.Tensor | None) -> int:
        if t is None or t.dim() < 2:
            raise ValueError("an 'irreps' tensor must be [..., K, C] with K = (lmax+1)^2")
        try:
            return lmax_from_num_coefficients(t.shape[-2])
        except ValueError as err:
            raise ValueError(
                f"an 'irreps' tensor must be [N, K, C] with K = (lmax+1)^2 (our layout); got shape {tuple(t.shape)}. "
                "For e3nn's [N, irreps.dim] layout pass irreps= / out_reps= with an e3nn Irreps"
            ) from err

    def translate(self, t: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """Positions move by ``shift [3]``; everything else is unchanged."""
        if self.kind == "position" and isinstance(t, torch.Tensor):
            return t + shift.to(dtype=t.dtype, device=t.device)
        return t

    def permute(self, t: Any, perm: torch.Tensor, inverse: torch.Tensor, num_atoms: int) -> Any:
        """Reorder atoms: new atom ``i`` is old atom ``perm[i]``; ``inverse[perm] = arange``."""
        if not isinstance(t, torch.Tensor):
            return t
        if self.kind == "atom_index":
            return inverse.to(t.device)[t]
        if self.is_per_atom(t, num_atoms):
            return t.index_select(0, perm.to(t.device))
        return t

    def is_per_atom(self, t: Any, num_atoms: int) -> bool:
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return False
        if self.per_atom is not None:
            return self.per_atom
        return t.shape[0] == num_atoms

    # ------------------------------------------------------------------ report
    def components(self, t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """``(label, part)`` pairs: the degree components of ``t`` (for error tables)."""
        if self.kind == "irreps":
            lmax = self.lmax(t)
            return [(f"l={l}", t[..., l * l : (l + 1) ** 2, :]) for l in range(lmax + 1)]
        if self.kind in ("vector", "position"):
            return [("l=1", t)]
        if self.kind == "rank2":
            eye = torch.eye(3, dtype=t.dtype, device=t.device)
            tr = t.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None, None] / 3 * eye
            anti = (t - t.transpose(-1, -2)) / 2
            sym = (t + t.transpose(-1, -2)) / 2 - tr
            return [("l=0", tr), ("l=1", anti), ("l=2", sym)]
        if self.kind == "e3nn":
            parts: dict[str, list[torch.Tensor]] = {}
            start = 0
            for mul, ir in self.irreps:
                d = mul * ir.dim
                parts.setdefault(f"l={ir.l}{'e' if ir.p == 1 else 'o'}", []).append(t[..., start : start + d])
                start += d
            return [(k, torch.cat(v, dim=-1)) for k, v in parts.items()]
        return [("l=0", t)]


def as_rep(spec: Any) -> Rep:
    """A :class:`Rep` from a name (``"vector"``), an e3nn ``Irreps`` (or its string), or a Rep."""
    if isinstance(spec, Rep):
        return spec
    if isinstance(spec, str) and spec in REP_NAMES:
        return Rep(spec)
    try:
        from e3nn import o3
    except ImportError:  # pragma: no cover - e3nn is a test dependency
        o3 = None
    if o3 is not None:
        if isinstance(spec, o3.Irreps):
            return Rep("e3nn", irreps=spec)
        if isinstance(spec, str) and any(ch.isdigit() for ch in spec):
            return Rep("e3nn", irreps=o3.Irreps(spec))
    raise ValueError(
        f"cannot interpret {spec!r} as a representation; use one of {REP_NAMES}, an e3nn Irreps, "
        "or est.testing.Rep(...)"
    )
