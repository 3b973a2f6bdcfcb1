r"""Whole-model checks: molecules and periodic cells, through adapters.

A model is seen through an *adapter* (:mod:`est.testing._adapters`):
``adapter(system) -> {name: tensor}`` for one structure
(:mod:`est.testing._system`), with how each output transforms.

Checks (:func:`check_model`), with ``g`` acting on the structure and on
the outputs:

==================  ==================================================  ===========================
check               structure                                           outputs
==================  ==================================================  ===========================
``repeat``          unchanged (a second call)                           unchanged
``rotation``        ``pos R^T`` (molecules)                             ``E``, ``F R^T``, ``R S R^T``
``cell_rotation``   ``pos R^T`` and ``cell R^T`` (periodic)             as rotation
``translation``     ``pos + t``                                         unchanged
``permutation``     atoms reordered                                     per-atom outputs reordered
``lattice_shift``   some atoms moved by integer lattice vectors         unchanged
``supercell``       2 x 1 x 1 along each periodic direction             ``2 E``, forces tiled, stress kept
``reflection``      ``pos Q^T`` (and cell) with ``det Q = -1``          as rotation (polar vectors)
==================  ==================================================  ===========================

``reflection`` is informational (SE(3) models need not be O(3)) unless
``parity=True``. In ``supercell`` only extensive outputs (``extensive``,
default ``("energy",)``), intensive ones (``intensive``, default
``("stress",)``) and per-atom outputs are compared.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch

from ._adapters import as_adapter
from ._report import EquivarianceReport, Recorder, Tolerance, make_tolerance
from ._reps import Rep
from ._rotations import describe_rotation, search_worst_rotation
from ._system import as_system

__all__ = ["check_model"]


def _rows(recorders: Sequence[Recorder]):
    return [row for rec in recorders for row in rec.rows()]


def check_model(
    model: Any,
    sample: Any,
    *,
    checks: Sequence[str] | None = None,
    dtype: torch.dtype | str | None = None,
    output_types: Mapping[str, Any] | None = None,
    tol: float | Tolerance | None = None,
    atol: float | None = None,
    parity: bool = False,
    num_rotations: int = 8,
    refine_steps: int = 12,
    num_translations: int = 3,
    num_permutations: int = 3,
    num_shifts: int = 3,
    rotations: torch.Tensor | None = None,
    extensive: Sequence[str] = ("energy",),
    intensive: Sequence[str] = ("stress", "virial"),
    seed: int = 0,
    name: str | None = None,
) -> "EquivarianceReport":
    """Check a whole model's symmetries on one structure (see the module docstring).

    Args:
        model: an est model (``model(batch) -> dict``), any callable
            ``(positions, numbers, cell, pbc) -> dict``, or an :class:`Adapter`.
        sample: a Data with est fields, an ``ase.Atoms``, a dict or a
            ``(positions, numbers, cell, pbc)`` tuple.
        checks: subset of ``repeat, rotation, cell_rotation, translation,
            permutation, reflection, lattice_shift, supercell`` (default: all
            that apply; ``rotation`` and ``cell_rotation`` are the same check,
            named by whether the sample is periodic).
        dtype: what the check runs in (sets the default tolerance): float64
            by default; ``"model"``: the model's own parameter dtype. A model
            in another dtype is copied and cast (yours is not changed);
            positions and cell are passed in this dtype.
        tol, atol: relative / absolute tolerance (dtype default).
        parity: assert the reflection check instead of only reporting it.
        rotations: fixed ``[M, 3, 3]`` rotations instead of the search.

    Returns:
        :class:`EquivarianceReport`; call ``.assert_ok()`` in tests.
    """
    adapter = as_adapter(model, dtype=dtype, output_types=output_types)
    system = as_system(sample)
    gen = torch.Generator().manual_seed(seed)
    n = system.num_atoms
    periodic = system.periodic
    rot_name = "cell_rotation" if periodic else "rotation"
    all_checks = ["repeat", rot_name, "translation", "permutation", "reflection"]
    if periodic:
        all_checks += ["lattice_shift", "supercell"]
    if checks is None:
        todo = all_checks
    else:
        unknown = set(checks) - set(all_checks) - {"rotation", "cell_rotation", "lattice_shift", "supercell"}
        if unknown:
            raise ValueError(f"check_model: unknown checks {sorted(unknown)}; expected among {all_checks + ['lattice_shift', 'supercell']}")
        todo = [c if c not in ("rotation", "cell_rotation") else rot_name for c in checks]
        todo = [c for c in dict.fromkeys(todo) if c in all_checks]
    tl = make_tolerance(tol, atol, adapter.dtype)

    ref = adapter(system)
    if not ref:
        raise ValueError(f"check_model: {adapter.name} returned no tensors")
    reps = {k: adapter.output_rep(k, v, n) for k, v in ref.items()}
    reference = {k: (v, reps[k]) for k, v in ref.items()}
    recorders: list[Recorder] = []

    def expected_rotated(Q: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: reps[k].transform(v, Q) for k, v in ref.items()}

    if "repeat" in todo:
        rec = Recorder("repeat", reference, tl)
        rec.record(adapter(system), ref, "identity (a second call on the same structure)", True)
        recorders.append(rec)

    for check, improper in ((rot_name, False), ("reflection", True)):
        if check not in todo:
            continue
        rec = Recorder(check, reference, tl, expected=(not improper) or parity)

        def objective(Q: torch.Tensor, phase: str, rec=rec) -> float:
            return rec.record(adapter(system.rotated(Q)), expected_rotated(Q), lambda: describe_rotation(Q), phase in ("random", "given"))

        search_worst_rotation(
            objective,
            num_random=num_rotations if not improper else max(2, num_rotations // 2),
            refine_steps=refine_steps if not improper else 0,
            special=not improper,
            candidates=rotations,
            generator=gen,
            improper=improper,
        )
        recorders.append(rec)

    if "translation" in todo:
        rec = Recorder("translation", reference, tl)
        scale = float(system.pos.abs().max()) + 1.0
        for _ in range(num_translations):
            t = torch.randn(3, generator=gen, dtype=torch.float64) * scale
            rec.record(adapter(system.translated(t)), ref, f"translation by {[round(v, 3) for v in t.tolist()]}", True)
        recorders.append(rec)

    if "permutation" in todo and n > 1:
        rec = Recorder("permutation", reference, tl)
        for _ in range(num_permutations):
            perm = torch.randperm(n, generator=gen)
            if bool((perm == torch.arange(n)).all()):
                perm = perm.roll(1)
            inv = torch.empty_like(perm)
            inv[perm] = torch.arange(n)
            exp = {k: reps[k].permute(v, perm, inv, n) for k, v in ref.items()}
            rec.record(adapter(system.permuted(perm)), exp, f"atom permutation {perm.tolist()[:12]}{'...' if n > 12 else ''}", True)
        recorders.append(rec)

    if "lattice_shift" in todo and periodic:
        rec = Recorder("lattice_shift", reference, tl)
        axes = system.pbc.nonzero().flatten()
        for i in range(num_shifts):
            move = torch.rand(n, generator=gen) < 0.5
            if i == 0:
                move[:] = True  # a global lattice translation
            if not bool(move.any()):
                move[0] = True
            k = torch.zeros(n, 3, dtype=torch.float64)
            k[:, axes] = torch.randint(-2, 3, (n, axes.numel()), generator=gen).to(torch.float64)
            k[~move] = 0
            if not bool(k.abs().sum() > 0):
                k[0, axes[0]] = 1.0
            moved = system.replace(pos=system.pos + k @ system.cell)
            desc = f"atoms {move.nonzero().flatten().tolist()[:8]} moved by integer lattice vectors"
            rec.record(adapter(moved), ref, desc, True)
        recorders.append(rec)

    if "supercell" in todo and periodic:
        for axis in system.pbc.nonzero().flatten().tolist():
            exp: dict[str, torch.Tensor] = {}
            ereps: dict[str, tuple[torch.Tensor, Rep]] = {}
            for k, v in ref.items():
                if reps[k].is_per_atom(v, n):
                    e = v.repeat(2, *([1] * (v.dim() - 1)))
                elif k in extensive:
                    e = 2 * v
                elif k in intensive:
                    e = v
                else:
                    continue
                exp[k] = e
                ereps[k] = (e, reps[k])
            label = ["2x1x1", "1x2x1", "1x1x2"][axis]
            rec = Recorder(f"supercell_{label}", ereps, tl)
            got = adapter(system.supercell(axis))
            rec.record({k: got[k] for k in exp if k in got} | {k: exp[k] * math.nan for k in exp if k not in got}, exp, f"{label} supercell", True)
            recorders.append(rec)

    meta = {
        "num_atoms": n,
        "periodic": periodic,
        "pbc": system.pbc.tolist(),
        "outputs": {k: r.label for k, r in reps.items()},
        "seed": seed,
    }
    title = f"equivariance of {name or adapter.name} on {n} atoms" + (" (periodic)" if periodic else "")
    return EquivarianceReport(_rows(recorders), title=title, dtype=adapter.dtype, meta=meta)
