r"""The spherical Fourier transform between irreps features and sphere samples.

With points :math:`p_s`, weights :math:`w_s` (sum :math:`4\pi`) and
:math:`Y_{sk} = Y_k(p_s)` (component normalisation):

.. math::
    F_{nsc} = \sum_k A_{sk} x_{nkc} \quad\text{(to the sphere)},\qquad
    x'_{nkc} = \sum_s B_{ks} F'_{nsc} \quad\text{(back to irreps)}.

``normalization`` chooses ``A`` and ``B``:

* ``"quadrature"``: :math:`A = Y`, :math:`B_{ks} = w_s Y_{sk} / 4\pi` (a true
  quadrature: exact for the grids and designs at their minimal sizes);
* ``"lambda"`` (the EST paper, Eq. 12): :math:`A = Y`,
  :math:`B_{ks} = \lambda_k Y_{sk}` with :math:`\lambda_k = 1/\sum_s Y_{sk}^2`;
* ``"column"`` (the released EST code): :math:`\hat Y_{sk} = Y_{sk}/\lVert Y_{:k}\rVert`,
  :math:`A = \hat Y`, :math:`B = \hat Y^T`. Grid values are then about
  :math:`1/\sqrt S` of the function values.

``degree_scaling`` multiplies the degree-l columns of ``A`` by :math:`n_l` and
divides the rows of ``B`` by it (the linear round trip is unchanged; what
changes is the amplitude a pointwise nonlinearity sees):
``"none"`` :math:`n_l = 1`, ``"component"`` :math:`n_l = 1/\sqrt{(2l+1)(L+1)}`
(EquiformerV2's grids: e3nn's ``ToS2Grid(normalization="component")``, about
unit grid values for unit-variance coefficients), ``"integral"``
:math:`1/\sqrt{4\pi}`, ``"norm"`` :math:`1/\sqrt{L+1}`.

Grid rotation (EST's training-time augmentation): rotating the points by
``R`` turns ``Y`` into ``Y D(R)^T``; we apply it as ``to_sphere(D^T x)`` and
``D from_sphere(F)`` with one Wigner-D per sample (the matrices are never
rebuilt). For ``"quadrature"`` this equals the transform rebuilt on the
rotated points exactly (the weights travel with the points). For
``"lambda"`` and ``"column"`` it is exact only where the column norms
:math:`\sum_s Y_{sk}^2` do not change under rotation (spherical designs
with :math:`t \ge 2L`, where they all equal S); on the Fibonacci lattice the rebuilt
normalisation would differ, and conjugation rotates the fixed transform
instead, as the released EST code does for its column normalisation (the
paper preset). Measured at L=6, S=182: the conjugated ``A`` differs from
the rebuilt one by 0.8% (``"column"``) and ``B`` by 1.6% (``"lambda"``),
relative Frobenius norm.
"""
from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from ..so3._harmonics import spherical_harmonics
from ..so3._layout import check_lmax, degree_index, num_coefficients
from .masters import Float64Masters
from .points import default_num_points, sphere_points

__all__ = ["SphericalFourierTransform", "NORMALIZATIONS", "DEGREE_SCALINGS", "degree_scale", "transform_matrices"]

NORMALIZATIONS = ("quadrature", "lambda", "column")
DEGREE_SCALINGS = ("none", "component", "integral", "norm")


def degree_scale(name: str, lmax: int) -> torch.Tensor:
    """``[L+1]`` float64 factors :math:`n_l` of a grid amplitude convention (module docstring)."""
    l = torch.arange(lmax + 1, dtype=torch.float64)
    if name == "component":
        return 1.0 / torch.sqrt((2 * l + 1) * (lmax + 1))
    if name == "integral":
        return torch.full_like(l, 1.0 / math.sqrt(4 * math.pi))
    if name == "norm":
        return torch.full_like(l, 1.0 / math.sqrt(lmax + 1))
    if name == "none":
        return torch.ones_like(l)
    raise ValueError(f"unknown degree_scaling {name!r}; expected one of {DEGREE_SCALINGS}")


def transform_matrices(
    lmax: int, points: torch.Tensor, weights: torch.Tensor, normalization: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A [S, K], B [K, S])`` in float64 for the given points and normalisation."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"unknown normalization {normalization!r}; expected one of {NORMALIZATIONS}")
    Y = spherical_harmonics(lmax, points.to(torch.float64))  # [S, K]
    if normalization == "quadrature":
        return Y, (weights.to(torch.float64)[:, None] * Y).T / (4 * math.pi)
    col = (Y * Y).sum(0)  # [K]
    if normalization == "lambda":
        return Y, (Y / col).T
    Yhat = Y / col.sqrt()
    return Yhat, Yhat.T.contiguous()


ROUND_TRIP_WARN = 0.1  # relative round-trip error above which an approximate point set warns


def round_trip_error(A: torch.Tensor, B: torch.Tensor) -> float:
    r"""RMS relative error of the linear round trip, :math:`\lVert BA - I
Vert_F/\sqrt K`
    (the expected :math:`\lVert BAx - x
Vert/\lVert x
Vert` for white-noise ``x``)."""
    K = A.shape[1]
    return float(torch.linalg.matrix_norm(B @ A - torch.eye(K, dtype=A.dtype)) / math.sqrt(K))


def _warn_inexact_round_trip(A: torch.Tensor, B: torch.Tensor, lmax: int, normalization: str) -> None:
    """Warn when a Fibonacci lattice smaller than the paper's size loses more than 10% in the round trip
    (at the paper's size the error is 0.13 at L=1 and 0.02-0.08 for L=2..8)."""
    if A.shape[0] >= default_num_points(lmax):
        return
    err = round_trip_error(A, B)
    if err > ROUND_TRIP_WARN:
        warnings.warn(
            f"fibonacci transform with {A.shape[0]} points at lmax={lmax} ({normalization!r}): the round trip "
            f"from_sphere(to_sphere(x)) is off by {err:.2f} of |x| (RMS); use more points (the paper's "
            f"(2L+1)(2L+2) = {default_num_points(lmax)}) or an exact kind ('design', 'gauss-legendre')",
            RuntimeWarning,
            stacklevel=3,
        )


def _apply_matrix(M: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``M [P, Q]`` applied to ``x [N, Q, C]`` as one 2-D GEMM: ``[N, P, C]``.

    ``x`` is viewed as ``[Q, N*C]`` (one copy at most) and the result returned
    as a transposed view of ``[P, N, C]``: about 2x faster forward+backward on
    CPU than broadcasting ``M @ x`` over N small matrices.
    """
    if x.dim() != 3:
        return M @ x
    N, Q, C = x.shape
    y = M @ x.transpose(0, 1).reshape(Q, N * C)  # [P, N*C]
    return y.view(M.shape[0], N, C).transpose(0, 1)  # [N, P, C] (explicit P: N may be 0)


class SphericalFourierTransform(Float64Masters):
    """Irreps ``[N, K, C]`` <-> sphere samples ``[N, S, C]`` by two cached matmuls.

    Args (keyword-only after ``lmax``):
        lmax: maximum degree L; ``K = (L+1)^2``.
        kind: point set, see :func:`est.sphere.sphere_points`.
        num_points, degree, resolution, relax_steps: passed to ``sphere_points``.
        normalization: ``"quadrature"``, ``"lambda"`` or ``"column"`` (module docstring).
        degree_scaling: grid amplitude per degree, ``"none"`` or e.g. ``"component"``
            (EquiformerV2's; module docstring).

    Attributes:
        points ``[S, 3]``, weights ``[S]``, to_matrix ``[S, K]``,
        from_matrix ``[K, S]``: buffers (``persistent=False``: not in
        checkpoints; they follow ``.to(device, dtype)``).

    Example:
        >>> sft = SphericalFourierTransform(2, kind="gauss-legendre").double()
        >>> x = torch.randn(5, 9, 4, dtype=torch.float64)
        >>> torch.allclose(sft.from_sphere(sft.to_sphere(x)), x)
        True
    """

    def __init__(
        self,
        lmax: int,
        *,
        kind: str = "design",
        num_points: int | None = None,
        normalization: str = "quadrature",
        degree: int | None = None,
        resolution: tuple[int, int] | None = None,
        relax_steps: int = 0,
        degree_scaling: str = "none",
    ) -> None:
        super().__init__()
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"unknown normalization {normalization!r}; expected one of {NORMALIZATIONS}")
        self.lmax = check_lmax(lmax)
        self.kind = kind
        self.normalization = normalization
        points, weights = sphere_points(
            kind, lmax, num_points, degree=degree, resolution=resolution, relax_steps=relax_steps
        )
        A, B = transform_matrices(lmax, points, weights, normalization)
        if kind == "fibonacci":
            _warn_inexact_round_trip(A, B, lmax, normalization)
        self.degree_scaling = degree_scaling
        if degree_scaling != "none":
            n = degree_scale(degree_scaling, lmax)[degree_index(lmax)]  # [K] n_l per coefficient
            A, B = A * n, B / n[:, None]
        # float64 masters: every cast of the module re-derives its buffers from
        # them, so .float().double() does not lose precision (see _apply)
        for name, value in dict(points=points, weights=weights, to_matrix=A, from_matrix=B).items():
            self.register_master(name, value)

    @property
    def points64(self) -> torch.Tensor:
        """The points in float64 on the CPU (independent of the module's dtype)."""
        return self._masters["points"]

    @property
    def num_points(self) -> int:
        return self.points.shape[0]

    @property
    def num_coefficients(self) -> int:
        return num_coefficients(self.lmax)

    def extra_repr(self) -> str:
        extra = f", degree_scaling={self.degree_scaling!r}" if self.degree_scaling != "none" else ""
        return f"lmax={self.lmax}, kind={self.kind!r}, num_points={self.num_points}, normalization={self.normalization!r}{extra}"

    def _check(self, x: torch.Tensor, dim_size: int, what: str, name: str) -> None:
        if x.dim() < 2 or x.shape[-2] != dim_size:
            raise ValueError(
                f"{name}: expected a tensor [..., {dim_size} ({what}), C], got shape {tuple(x.shape)}"
            )

    def to_sphere(self, x: torch.Tensor, rotation: torch.Tensor | None = None) -> torch.Tensor:
        """``[..., K, C] -> [..., S, C]``. ``rotation``: Wigner-D ``[..., K, K]`` rotating the grid."""
        self._check(x, self.num_coefficients, f"K for lmax={self.lmax}", "to_sphere")
        if rotation is not None:
            x = rotation.transpose(-1, -2) @ x  # [..., K, C]
        return _apply_matrix(self.to_matrix.to(x.dtype), x)  # [..., S, C]

    def from_sphere(self, f: torch.Tensor, rotation: torch.Tensor | None = None) -> torch.Tensor:
        """``[..., S, C] -> [..., K, C]``; ``rotation`` as in :meth:`to_sphere`."""
        self._check(f, self.num_points, "S points", "from_sphere")
        x = _apply_matrix(self.from_matrix.to(f.dtype), f)  # [..., K, C]
        if rotation is not None:
            x = rotation @ x
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Linear round trip ``from_sphere(to_sphere(x))`` (identity for exact kinds)."""
        return self.from_sphere(self.to_sphere(x))
