r"""Equivariance of layers: ``f(rho_in(g) x) == rho_out(g) f(x)``.

For every check the inputs are transformed, ``fn`` is called again, and the
output is compared with the transformed reference output ``f(x)``:

* ``repeat``: ``g`` = identity (two identical calls must agree: catches
  random rolls, dropout left on, uninitialised memory),
* ``rotation``: proper rotations from a worst-case search
  (:func:`est.testing.search_worst_rotation`: special turns, Haar-random
  rotations, then a local pattern search around the worst),
* ``parity`` (``parity=True``): improper ``-R``; degree ``l`` of our layout
  has parity ``(-1)^l``, e3nn irreps carry their own,
* ``permutation``: atoms (dim 0) reordered, within each graph when ``batch``
  is given; per-atom outputs are reordered, the others must be invariant,
* ``translation``: only when an input has the ``"position"`` representation.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Mapping, Sequence

import torch

from est.so3 import num_coefficients

from ._cast import DTYPE_HINT, is_dtype_error, resolve_dtype
from ._report import EquivarianceReport, Recorder, Tolerance, make_tolerance
from ._reps import Rep, as_rep
from ._rotations import describe_rotation, search_worst_rotation

__all__ = ["assert_equivariant", "equivariance_report"]


def _as_outputs(out: Any) -> dict[str, torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return {"out": out}
    if isinstance(out, Mapping):
        return {str(k): v for k, v in out.items() if isinstance(v, torch.Tensor)}
    if isinstance(out, (tuple, list)):
        return {f"out[{i}]": v for i, v in enumerate(out) if isinstance(v, torch.Tensor)}
    raise TypeError(f"fn must return a tensor, a tuple/list or a dict of tensors, got {type(out).__name__}")


def _infer_rep(t: torch.Tensor) -> Rep:
    if t.dim() == 3 and t.is_floating_point() and math.isqrt(t.shape[1]) ** 2 == t.shape[1]:
        return Rep("irreps")
    return Rep("scalar")


def _spec_list(spec: Any, n: int, what: str) -> list | None:
    if spec is None:
        return None
    if isinstance(spec, (list, tuple)) and not _is_irreps(spec):
        if len(spec) != n:
            raise ValueError(f"{what} has {len(spec)} entries but there are {n} tensors")
        return list(spec)
    return [spec] * n


@contextlib.contextmanager
def _eval_mode(fn: Any):
    if isinstance(fn, torch.nn.Module) and fn.training:
        fn.eval()
        try:
            yield
        finally:
            fn.train()
    else:
        yield


def _random_within_graphs(n: int, batch: torch.Tensor | None, gen: torch.Generator) -> torch.Tensor:
    """A permutation of ``range(n)`` that keeps every atom in its graph (and ``batch`` sorted)."""
    if batch is None:
        perm = torch.randperm(n, generator=gen)
        if n > 1 and bool((perm == torch.arange(n)).all()):
            perm = perm.roll(1)
        return perm
    perm = torch.arange(n)
    for g in torch.unique(batch):
        idx = (batch.cpu() == g).nonzero().flatten()
        perm[idx] = idx[torch.randperm(idx.numel(), generator=gen)]
    return perm


def equivariance_report(
    fn: Callable,
    *,
    lmax: int | None = None,
    irreps: Any = None,
    inputs: Any = None,
    in_reps: Any = None,
    out_reps: Any = None,
    channels: int = 8,
    num_nodes: int = 6,
    batch: torch.Tensor | int | None = None,
    dtype: torch.dtype | str | None = None,
    tol: float | Tolerance | None = None,
    atol: float | None = None,
    parity: bool = False,
    permutation: bool | None = None,
    num_rotations: int = 16,
    refine_steps: int = 24,
    num_permutations: int = 3,
    rotations: torch.Tensor | None = None,
    seed: int = 0,
    name: str | None = None,
) -> EquivarianceReport:
    """Measure how equivariant ``fn`` is; returns an :class:`EquivarianceReport` (never raises on errors).

    Inputs (one of):
        ``lmax``: one random input ``x [num_nodes, (lmax+1)^2, channels]`` in our layout.
        ``irreps``: e3nn ``Irreps`` (or a list of them, one per input): random
        ``[num_nodes, irreps.dim]`` tensors. Defaults to ``fn.irreps_in`` (or
        ``fn.irreps_in1, fn.irreps_in2``) for e3nn modules.
        ``inputs``: your own tensors (a tensor or a tuple), with ``in_reps``
        naming how each transforms (``"irreps"``, ``"vector"``, ``"position"``,
        ``"scalar"``, ``"atom_index"``, e3nn ``Irreps``, ...; inferred for
        ``[N, K, C]`` tensors and when ``irreps`` is given).

    Outputs: a tensor, tuple or dict; ``out_reps`` (one spec, a list, or a
    dict by output name) says how they transform. Default: ``fn.irreps_out``
    for e3nn modules, ``"irreps"`` for ``[N, K, C]`` tensors (K a square),
    ``"scalar"`` otherwise.

    Args:
        batch: graph index ``[num_nodes]`` (or a number of graphs, split
            evenly), passed as ``fn(..., batch=batch)``; permutations then stay
            within graphs.
        dtype: what the check runs in: float64 by default; ``"model"``: the
            module's own parameter dtype. A module in another dtype is copied
            and cast (yours is not changed); random and given floating inputs
            are cast to it. A plain function gets inputs in this dtype.
        tol, atol: relative / absolute tolerance (default from the dtype:
            float64 1e-10, float32 1e-4, for exactly equivariant layers; pass
            the stated bound for sampled ones).
        parity: also check improper rotations ``-R``.
        permutation: check atom permutations (default: yes when dim 0 of the
            inputs has more than one atom).
        num_rotations, refine_steps: random rotations and local-search
            evaluations; ``rotations [M, 3, 3]`` replaces both.
        seed: every random draw comes from ``torch.Generator().manual_seed(seed)``.
    """
    gen = torch.Generator().manual_seed(seed)
    given = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs or ())
    fn, dtype = resolve_dtype(fn, dtype, inputs=given)
    title = name or getattr(fn, "__name__", None) or type(fn).__name__

    # ---------------------------------------------------------------- inputs
    if inputs is None:
        if lmax is not None:
            x = torch.randn(num_nodes, num_coefficients(lmax), channels, generator=gen, dtype=torch.float64)
            inputs, reps = (x.to(dtype),), [Rep("irreps")]
        else:
            if irreps is None:
                if hasattr(fn, "irreps_in"):
                    irreps = fn.irreps_in
                elif hasattr(fn, "irreps_in1") and hasattr(fn, "irreps_in2"):
                    irreps = [fn.irreps_in1, fn.irreps_in2]
                else:
                    raise ValueError(
                        "assert_equivariant: say what fn takes: lmax= (our [N, K, C] layout), irreps= "
                        "(e3nn layout), or inputs= with in_reps="
                    )
            irreps_list = list(irreps) if isinstance(irreps, list) or (isinstance(irreps, tuple) and not _is_irreps(irreps)) else [irreps]
            reps = [as_rep(i) for i in irreps_list]
            inputs = tuple(
                torch.randn(num_nodes, r.irreps.dim, generator=gen, dtype=torch.float64).to(dtype) for r in reps
            )
    else:
        inputs = tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in given)
        specs = _spec_list(in_reps, len(inputs), "in_reps")
        if specs is None and irreps is not None:
            specs = _spec_list(irreps, len(inputs), "irreps")
        if specs is None:
            reps = []
            for i, t in enumerate(inputs):
                r = _infer_rep(t)
                if r.kind != "irreps" and t.is_floating_point():
                    raise ValueError(
                        f"assert_equivariant: cannot tell how input {i} (shape {tuple(t.shape)}) transforms; "
                        "pass in_reps=(...) with 'irreps', 'vector', 'position', 'scalar', 'atom_index' or an e3nn Irreps"
                    )
                reps.append(r)
        else:
            reps = [as_rep(s) for s in specs]
    N = inputs[0].shape[0]
    kwargs: dict[str, Any] = {}
    if batch is not None:
        if isinstance(batch, int):
            batch = torch.arange(N) * batch // N
        kwargs["batch"] = batch

    def call(args: Sequence[Any]) -> dict[str, torch.Tensor]:
        return _as_outputs(fn(*args, **kwargs))

    with _eval_mode(fn):
        try:
            ref = call(inputs)
        except RuntimeError as err:
            if is_dtype_error(err):
                raise RuntimeError(f"assert_equivariant: {title} failed on {dtype} inputs: {err}. {DTYPE_HINT}") from err
            raise
        out_specs = out_reps
        if out_specs is None and hasattr(fn, "irreps_out") and len(ref) == 1:
            out_specs = fn.irreps_out
        if isinstance(out_specs, Mapping):
            oreps = {k: as_rep(out_specs[k]) if k in out_specs else _infer_rep(v) for k, v in ref.items()}
        elif out_specs is None:
            oreps = {k: _infer_rep(v) for k, v in ref.items()}
        else:
            lst = _spec_list(out_specs, len(ref), "out_reps") if not _is_irreps(out_specs) else [out_specs] * len(ref)
            oreps = {k: as_rep(s) for k, s in zip(ref, lst)}
        reference = {k: (ref[k], oreps[k]) for k in ref}
        tl = make_tolerance(tol, atol, dtype)
        recorders: list[Recorder] = []

        def transformed(Q: torch.Tensor) -> tuple[list[Any], dict[str, torch.Tensor]]:
            args = [r.transform(t, Q) for t, r in zip(inputs, reps)]
            exp = {k: oreps[k].transform(v, Q) for k, v in ref.items()}
            return args, exp

        # repeat (identity)
        rec = Recorder("repeat", reference, tl)
        rec.record(call(inputs), ref, "identity (a second call on the same input)", True)
        recorders.append(rec)

        # proper and improper rotations
        for check, improper in (("rotation", False), ("parity", True)):
            if improper and not parity:
                continue
            rec = Recorder(check, reference, tl)

            def objective(Q: torch.Tensor, phase: str, rec=rec) -> float:
                args, exp = transformed(Q)
                return rec.record(call(args), exp, lambda: describe_rotation(Q), phase in ("random", "given"))

            search_worst_rotation(
                objective,
                num_random=num_rotations,
                refine_steps=refine_steps,
                candidates=rotations,
                generator=gen,
                improper=improper,
            )
            recorders.append(rec)

        # permutations of atoms
        if permutation is None:
            permutation = N > 1
        if permutation:
            rec = Recorder("permutation", reference, tl)
            for _ in range(num_permutations):
                perm = _random_within_graphs(N, kwargs.get("batch"), gen)
                inv = torch.empty_like(perm)
                inv[perm] = torch.arange(N)
                args = [r.permute(t, perm, inv, N) for t, r in zip(inputs, reps)]
                exp = {k: oreps[k].permute(v, perm, inv, N) for k, v in ref.items()}
                desc = f"atom permutation {perm.tolist()[:12]}{'...' if N > 12 else ''}"
                rec.record(call(args), exp, desc, True)
            recorders.append(rec)

        # translations (only with position inputs)
        if any(r.kind == "position" for r in reps):
            rec = Recorder("translation", reference, tl)
            for _ in range(3):
                shift = torch.randn(3, generator=gen, dtype=torch.float64) * 3.0
                args = [r.translate(t, shift) for t, r in zip(inputs, reps)]
                rec.record(call(args), ref, f"translation by {[round(v, 3) for v in shift.tolist()]}", True)
            recorders.append(rec)

    rows = [row for rec in recorders for row in rec.rows()]
    meta = {
        "inputs": [r.label for r in reps],
        "outputs": {k: r.label for k, r in oreps.items()},
        "num_nodes": N,
        "seed": seed,
    }
    return EquivarianceReport(rows, title=f"equivariance of {title}", dtype=dtype, meta=meta)


def _is_irreps(x: Any) -> bool:
    try:
        from e3nn import o3
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, o3.Irreps)


def assert_equivariant(fn: Callable, **kwargs: Any) -> EquivarianceReport:
    """Raise ``AssertionError`` unless ``fn`` is equivariant; returns the report when it is.

    Takes the arguments of :func:`equivariance_report`. The message names each
    failing check, output and degree ``l``, the error against the tolerance,
    and the worst rotation found (axis, angle, matrix).

    Example:
        >>> from est.so3 import degree_index
        >>> w = torch.randn(3, 8, 8, dtype=torch.float64)
        >>> def degreewise_linear(x):  # [N, 9, 8] -> [N, 9, 8]: one matrix per degree
        ...     return torch.einsum("nkc,kcd->nkd", x, w[degree_index(2)])
        >>> _ = assert_equivariant(degreewise_linear, lmax=2)
    """
    report = equivariance_report(fn, **kwargs)
    report.assert_ok()
    return report
