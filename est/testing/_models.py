r"""Whole-model checks: molecules and periodic cells, through adapters.

A model is seen through an *adapter*: ``adapter(system) -> {name: tensor}``
for one structure. Two adapters ship:

* :class:`BatchModelAdapter` for the est model contract
  (``model(batch) -> {"energy" [B], "forces" [N, 3], "stress" [B, 3, 3],
  "properties" [B, T]}``, ``batch`` a ``torch_geometric`` Batch with the
  fields of ``docs/CONVENTIONS.md``); graph dimensions are squeezed.
* :class:`CallableAdapter` for anything else (e3nn, MACE, fairchem, ASE
  calculators wrapped in a function): ``fn(positions [n, 3], numbers [n],
  cell [3, 3] | None, pbc [3]) -> dict``.

How each output transforms comes from its name (``energy``: invariant;
``forces``, ``dipole``: vectors; ``stress``, ``virial``: rank 2, ``R S R^T``;
anything else invariant) unless ``output_types`` says otherwise, e.g.
``{"properties": "vector"}`` for a ``[B, 3]`` vector property.

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

import contextlib
import dataclasses
import inspect
import math
from typing import Any, Callable, Mapping, Sequence

import torch

from ._cast import DTYPE_HINT, is_dtype_error, resolve_dtype
from ._report import EquivarianceReport, Recorder, Tolerance, make_tolerance
from ._reps import Rep, as_rep
from ._rotations import describe_rotation, search_worst_rotation

__all__ = [
    "System",
    "as_system",
    "Adapter",
    "BatchModelAdapter",
    "CallableAdapter",
    "as_adapter",
    "check_model",
    "DEFAULT_OUTPUT_TYPES",
]

#: how outputs transform, by name (anything else: invariant)
DEFAULT_OUTPUT_TYPES = {
    "energy": "graph_scalar",
    "free_energy": "graph_scalar",
    "forces": "vector",
    "dipole": "vector",
    "stress": "rank2",
    "virial": "rank2",
    "properties": "graph_scalar",
}

_PER_ATOM_FIELDS = ("fixed", "tags")
_GRAPH_KEYS = ("energy", "free_energy", "stress", "virial", "properties", "dipole")


@dataclasses.dataclass(kw_only=True)
class System:
    """One structure. ``cell`` rows are lattice vectors (``None`` or zeros: molecule)."""

    pos: torch.Tensor  # [n, 3] float64
    numbers: torch.Tensor  # [n] long
    cell: torch.Tensor | None = None  # [3, 3] float64
    pbc: torch.Tensor = dataclasses.field(default_factory=lambda: torch.zeros(3, dtype=torch.bool))  # [3]
    atom_fields: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # per-atom extras

    @property
    def num_atoms(self) -> int:
        return self.pos.shape[0]

    @property
    def periodic(self) -> bool:
        return bool(self.pbc.any()) and self.cell is not None

    def replace(self, **kw: Any) -> "System":
        return dataclasses.replace(self, **kw)

    def rotated(self, Q: torch.Tensor) -> "System":
        Q = Q.to(self.pos.dtype)
        return self.replace(pos=self.pos @ Q.T, cell=None if self.cell is None else self.cell @ Q.T)

    def translated(self, t: torch.Tensor) -> "System":
        return self.replace(pos=self.pos + t.to(self.pos.dtype))

    def permuted(self, perm: torch.Tensor) -> "System":
        return self.replace(
            pos=self.pos[perm], numbers=self.numbers[perm], atom_fields={k: v[perm] for k, v in self.atom_fields.items()}
        )

    def supercell(self, axis: int) -> "System":
        """Doubled along lattice vector ``axis``: atoms ``[original; original + a_axis]``."""
        assert self.cell is not None
        shift = self.cell[axis]
        cell = self.cell.clone()
        cell[axis] = 2 * cell[axis]
        return self.replace(
            pos=torch.cat([self.pos, self.pos + shift]),
            numbers=self.numbers.repeat(2),
            cell=cell,
            atom_fields={k: v.repeat(2, *([1] * (v.dim() - 1))) for k, v in self.atom_fields.items()},
        )


def as_system(sample: Any) -> System:
    """A :class:`System` from a ``torch_geometric`` Data (est conventions), an ``ase.Atoms``,
    a dict with ``pos``/``positions`` and ``numbers``/``atomic_numbers`` (optional ``cell``, ``pbc``),
    a ``(positions, numbers[, cell[, pbc]])`` tuple, or a System."""
    if isinstance(sample, System):
        return sample
    get: Callable[[str], Any]
    if hasattr(sample, "get_positions") and hasattr(sample, "get_atomic_numbers"):  # ase.Atoms
        pos, numbers = sample.get_positions(), sample.get_atomic_numbers()
        cell, pbc = sample.cell.array, sample.pbc
        extras = {"tags": sample.get_tags()} if hasattr(sample, "get_tags") else {}
        fixed = None
        for c in getattr(sample, "constraints", []):
            idx = getattr(c, "index", None)
            if idx is not None:
                fixed = torch.zeros(len(numbers), dtype=torch.long)
                fixed[torch.as_tensor(idx)] = 1
        if fixed is not None:
            extras["fixed"] = fixed
    elif isinstance(sample, (tuple, list)):
        pos, numbers = sample[0], sample[1]
        cell = sample[2] if len(sample) > 2 else None
        pbc = sample[3] if len(sample) > 3 else None
        extras = {}
    else:
        if isinstance(sample, Mapping):
            get = sample.get
        else:  # torch_geometric Data
            get = lambda k: getattr(sample, k, None)  # noqa: E731
        pos = get("pos") if get("pos") is not None else get("positions")
        numbers = get("atomic_numbers") if get("atomic_numbers") is not None else get("numbers")
        cell, pbc = get("cell"), get("pbc")
        if pos is None or numbers is None:
            raise ValueError(
                f"check_model: the sample needs positions (pos) and atomic numbers (atomic_numbers); got {type(sample).__name__}"
            )
        extras = {k: get(k) for k in _PER_ATOM_FIELDS if get(k) is not None}
    pos_t = torch.as_tensor(pos).detach().to(torch.float64).reshape(-1, 3)
    n = pos_t.shape[0]
    numbers_t = torch.as_tensor(numbers).detach().reshape(-1)
    numbers_t = (numbers_t.round() if numbers_t.is_floating_point() else numbers_t).long()  # old OC20 files: float Z
    if numbers_t.numel() != n:
        raise ValueError(f"check_model: {numbers_t.numel()} atomic numbers for {n} positions")
    cell_t = None if cell is None else torch.as_tensor(cell).detach().to(torch.float64).reshape(3, 3)
    if cell_t is not None and float(cell_t.abs().sum()) == 0:
        cell_t = None
    if pbc is None:
        pbc_t = torch.full((3,), cell_t is not None, dtype=torch.bool)
    else:
        pbc_t = torch.as_tensor(pbc).detach().reshape(-1).bool()
        pbc_t = pbc_t.expand(3).clone() if pbc_t.numel() == 1 else pbc_t.reshape(3)
    if bool(pbc_t.any()) and cell_t is None:
        raise ValueError("check_model: the sample is periodic (pbc has True) but has no cell; give the lattice vectors as rows")
    atom_fields = {}
    for k, v in extras.items():
        v = torch.as_tensor(v).detach()
        if v.dim() >= 1 and v.shape[0] == n:
            atom_fields[k] = v
    return System(pos=pos_t, numbers=numbers_t, cell=cell_t, pbc=pbc_t, atom_fields=atom_fields)


class Adapter:
    """Base class: ``adapter(system) -> {name: tensor}`` for one structure.

    Subclasses set ``dtype`` (the dtype the model runs in, which sets the
    default tolerance) and may override :meth:`output_rep`.
    """

    dtype: torch.dtype = torch.float64
    output_types: Mapping[str, Any] = {}
    name: str = "model"

    def __call__(self, system: System) -> dict[str, torch.Tensor]:  # pragma: no cover - interface
        raise NotImplementedError

    def output_rep(self, key: str, value: torch.Tensor, num_atoms: int) -> Rep:
        """How output ``key`` transforms: ``output_types``, then :data:`DEFAULT_OUTPUT_TYPES`, else invariant."""
        rep = as_rep(self.output_types.get(key, DEFAULT_OUTPUT_TYPES.get(key, "scalar")))
        per_atom = rep.per_atom
        if key == "forces":
            per_atom = True
        elif key in _GRAPH_KEYS:
            per_atom = False
        return Rep(rep.kind, irreps=rep.irreps, per_atom=per_atom)


@contextlib.contextmanager
def _eval(model: Any):
    if isinstance(model, torch.nn.Module) and model.training:
        model.eval()
        try:
            yield
        finally:
            model.train()
    else:
        yield


@contextlib.contextmanager
def _dtype_hint(name: str, dtype: torch.dtype):
    """Mixed-dtype errors from inside the model, re-raised with the fix."""
    try:
        yield
    except RuntimeError as err:
        if is_dtype_error(err):
            raise RuntimeError(f"check_model: {name} failed with {dtype} positions: {err}. {DTYPE_HINT}") from err
        raise


def _detach(out: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Outputs as detached CPU tensors (comparisons run on the CPU, in float64)."""
    return {k: v.detach().cpu() for k, v in out.items() if isinstance(v, torch.Tensor)}


def _model_device(model: Any) -> torch.device:
    if isinstance(model, torch.nn.Module):
        for p in list(model.parameters()) + list(model.buffers()):
            return p.device
    return torch.device("cpu")


class CallableAdapter(Adapter):
    """Any ``fn(positions [n, 3], numbers [n], cell [3, 3] | None, pbc [3]) -> dict``.

    Args:
        fn: the callable; positions and cell are passed in ``dtype``, on
            ``device`` (default: the module's device, else the CPU).
        dtype: what the check runs in (sets the default tolerance): float64
            by default, ``"model"`` for a module's own dtype. A module in
            another dtype is copied and cast (yours is not changed).
        output_types: ``{output name: representation}`` overrides
            (``"vector"``, ``"rank2"``, ``"scalar"``, an e3nn Irreps, ...).
    """

    def __init__(
        self,
        fn: Callable,
        *,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        output_types: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.fn, self.dtype = resolve_dtype(fn, dtype)
        self.device = torch.device(device) if device is not None else _model_device(fn)
        self.output_types = dict(output_types or {})

    def __call__(self, system: System) -> dict[str, torch.Tensor]:
        dev = self.device
        cell = None if system.cell is None else system.cell.to(device=dev, dtype=self.dtype)
        with _eval(self.fn), _dtype_hint(self.name, self.dtype):
            out = self.fn(system.pos.to(device=dev, dtype=self.dtype), system.numbers.to(dev), cell, system.pbc.to(dev))
        if not isinstance(out, Mapping):
            raise TypeError(f"{self.name} must return a dict of outputs (e.g. {{'energy': ..., 'forces': ...}}), got {type(out).__name__}")
        return _detach(out)


class BatchModelAdapter(Adapter):
    """An est-contract model: ``model(batch) -> dict`` with graph-level outputs ``[B, ...]``.

    Builds a one-graph ``torch_geometric`` Batch with the fields of
    ``docs/CONVENTIONS.md`` (pos in ``dtype``; cell zeros for molecules;
    ``fixed``/``tags`` from the sample or zeros) and squeezes the graph
    dimension of ``energy``, ``stress``, ``properties`` and any output whose
    first dimension is 1 while the structure has more atoms.

    Args:
        dtype: what the check runs in: float64 by default, ``"model"`` for the
            model's own parameter dtype. A model in another dtype is copied
            and cast (yours is not changed); positions and cell are passed in it.
        device: where the batch goes (default: the model's device); outputs
            come back to the CPU for the comparisons.
    """

    def __init__(
        self,
        model: Callable,
        *,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        output_types: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        self.name = name or type(model).__name__
        self.model, self.dtype = resolve_dtype(model, dtype)
        self.device = torch.device(device) if device is not None else _model_device(model)
        self.output_types = dict(output_types or {})

    def batch(self, system: System):
        from torch_geometric.data import Batch, Data

        n = system.num_atoms
        cell = torch.zeros(3, 3, dtype=torch.float64) if system.cell is None else system.cell
        fields = dict(
            pos=system.pos.to(self.dtype),
            atomic_numbers=system.numbers,
            natoms=torch.tensor([n], dtype=torch.long),
            cell=cell.to(self.dtype).reshape(1, 3, 3),
            pbc=system.pbc.reshape(1, 3),
            fixed=torch.zeros(n, dtype=torch.long),
            tags=torch.zeros(n, dtype=torch.long),
            sid=torch.zeros(1, dtype=torch.long),
            fid=torch.zeros(1, dtype=torch.long),
            idx=torch.zeros(1, dtype=torch.long),
        )
        fields.update(system.atom_fields)
        return Batch.from_data_list([Data(**fields)]).to(self.device)

    def __call__(self, system: System) -> dict[str, torch.Tensor]:
        with _eval(self.model), _dtype_hint(self.name, self.dtype):
            out = self.model(self.batch(system))
        if not isinstance(out, Mapping):
            raise TypeError(f"{self.name}(batch) must return a dict (model contract), got {type(out).__name__}")
        res = {}
        n = system.num_atoms
        for k, v in _detach(out).items():
            if v.dim() >= 1 and v.shape[0] == 1 and (k in _GRAPH_KEYS or n > 1):
                v = v[0]  # drop the graph dimension (B = 1)
            res[k] = v
        return res


def as_adapter(
    model: Any, *, dtype: torch.dtype | str | None = None, output_types: Mapping[str, Any] | None = None
) -> Adapter:
    """An :class:`Adapter` for ``model``: adapters pass through; callables of four (or more)
    parameters get :class:`CallableAdapter`; one-argument models (``model(batch)``) get
    :class:`BatchModelAdapter`. ``dtype``: float64 by default (see :class:`BatchModelAdapter`)."""
    if isinstance(model, Adapter):
        return model
    if not callable(model):
        raise TypeError(f"check_model: model must be callable, got {type(model).__name__}")
    target = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        params = [
            p for p in inspect.signature(target).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
        nparams = len(params)
    except (TypeError, ValueError):
        nparams = 1
    if nparams >= 3:
        return CallableAdapter(model, dtype=dtype, output_types=output_types)
    if nparams == 1:
        return BatchModelAdapter(model, dtype=dtype, output_types=output_types)
    raise TypeError(
        f"check_model: cannot tell how to call {type(model).__name__}: it takes {nparams} required arguments. "
        "Expected model(batch) (est contract) or fn(positions, numbers, cell, pbc); wrap it in "
        "est.testing.CallableAdapter / BatchModelAdapter"
    )


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
