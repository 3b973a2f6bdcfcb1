r"""Per-module equivariance inside a model: where does the error come from?

:func:`check_modules` runs the model on a structure and on rotated copies of
it, records the outputs of its submodules with forward hooks, and compares
every recorded node-feature tensor with the rotated original:

.. math:: e_m(R) = \max |h_m(R x) - D(R)\, h_m(x)|

for each module ``m`` whose output is ``[n, K, C]`` in our layout
(``n`` = number of atoms, ``K = (L+1)^2``). Modules that run several times
per forward (shared blocks) are compared call by call. Rows of the report
are ``(rotation, module name [#call], degree l)``, in the order the modules
ran, so the first failing row is where equivariance is lost.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from ._adapters import BatchModelAdapter, as_adapter
from ._report import EquivarianceReport, Recorder, Tolerance, make_tolerance
from ._reps import Rep
from ._rotations import describe_rotation, search_worst_rotation
from ._system import as_system

__all__ = ["check_modules"]


def _is_node_irreps(t: Any, n: int) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.is_floating_point()
        and t.dim() == 3
        and t.shape[0] == n
        and math.isqrt(t.shape[1]) ** 2 == t.shape[1]
    )


def check_modules(
    model: torch.nn.Module,
    sample: Any,
    *,
    modules: Sequence[str] | Callable[[str, torch.nn.Module], bool] | None = None,
    dtype: torch.dtype | str | None = None,
    tol: float | Tolerance | None = None,
    atol: float | None = None,
    num_rotations: int = 4,
    refine_steps: int = 0,
    rotations: torch.Tensor | None = None,
    seed: int = 0,
    name: str | None = None,
) -> EquivarianceReport:
    """Equivariance error of every submodule's ``[n, K, C]`` output (see the module docstring).

    Args:
        model: an ``nn.Module`` (est contract ``model(batch)`` or a callable
            module ``(positions, numbers, cell, pbc)``).
        sample: as for :func:`check_model`.
        dtype: as for :func:`check_model` (float64 by default; the model is
            copied and cast, yours is not changed).
        modules: module names to watch, or a predicate ``(name, module) -> bool``;
            default: every submodule (those whose output is not node irreps are skipped).
        refine_steps: local search around the worst rotation (off by default:
            the per-module error is a profile, the end-to-end search is
            :func:`check_model`'s job).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"check_modules needs an nn.Module (hooks), got {type(model).__name__}")
    adapter = as_adapter(model, dtype=dtype)
    # hooks go on the module the adapter calls: a copy when it was cast to the check's dtype
    model = adapter.model if isinstance(adapter, BatchModelAdapter) else adapter.fn
    system = as_system(sample)
    n = system.num_atoms
    gen = torch.Generator().manual_seed(seed)
    if modules is None:
        select = lambda nm, m: nm != ""  # noqa: E731
    elif callable(modules):
        select = modules
    else:
        wanted = set(modules)
        missing = wanted - {nm for nm, _ in model.named_modules()}
        if missing:
            raise ValueError(f"check_modules: no submodules named {sorted(missing)} in {type(model).__name__}")
        select = lambda nm, m: nm in wanted  # noqa: E731

    records: list[tuple[str, torch.Tensor]] = []
    handles = []

    def hook_for(nm: str):
        def hook(mod, args, out):
            if _is_node_irreps(out, n):
                records.append((nm, out.detach().to("cpu")))

        return hook

    for nm, mod in model.named_modules():
        if select(nm, mod):
            handles.append(mod.register_forward_hook(hook_for(nm)))
    try:
        def run(system_) -> dict[str, torch.Tensor]:
            records.clear()
            adapter(system_)
            counts: dict[str, int] = {}
            out = {}
            for nm, t in records:
                k = counts.get(nm, 0)
                counts[nm] = k + 1
                out[nm if k == 0 else f"{nm}#{k}"] = t
            return out

        ref = run(system)
        if not ref:
            raise ValueError(
                f"check_modules: no watched submodule of {type(model).__name__} returned node features [n={n}, K, C]"
            )
        rep = Rep("irreps")
        reference = {k: (v, rep) for k, v in ref.items()}
        rec = Recorder("rotation", reference, make_tolerance(tol, atol, adapter.dtype))

        def objective(Q: torch.Tensor, phase: str) -> float:
            got = run(system.rotated(Q))
            if set(got) != set(ref):
                raise AssertionError(f"check_modules: the modules that ran changed under rotation: {sorted(set(got) ^ set(ref))}")
            exp = {k: rep.transform(v, Q) for k, v in ref.items()}
            return rec.record(got, exp, lambda: describe_rotation(Q), phase in ("random", "given"))

        search_worst_rotation(objective, num_random=num_rotations, refine_steps=refine_steps, special=False, candidates=rotations, generator=gen)
    finally:
        for h in handles:
            h.remove()
    title = f"per-module equivariance of {name or adapter.name} on {n} atoms" + (" (periodic)" if system.periodic else "")
    return EquivarianceReport(rec.rows(), title=title, dtype=adapter.dtype, meta={"num_atoms": n, "periodic": system.periodic, "modules": list(ref)})
