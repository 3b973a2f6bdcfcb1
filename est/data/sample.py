"""The one sample type: a ``torch_geometric.data.Data`` with the fields of
``docs/CONVENTIONS.md``.

Every reader in :mod:`est.data` returns samples built by :func:`make_sample`,
so batches from different sources mix cleanly:

=================  ================  ==========================================
field              dtype / shape     meaning
=================  ================  ==========================================
``pos``            float32 [n, 3]    positions, Angstrom
``atomic_numbers`` int64 [n]         Z
``natoms``         int64 [1]         n
``cell``           float32 [1, 3, 3] lattice vectors as rows; zeros (molecules)
``pbc``            bool [1, 3]       periodic directions; False (molecules)
``fixed``          int64 [n]         1 = frozen atom; zeros for molecules
``tags``           int64 [n]         0 sub-surface, 1 surface, 2 adsorbate
``energy``         float32 [1]       eV (S2EF energy, IS2RE relaxed energy)
``forces``         float32 [n, 3]    eV/A (S2EF)
``y``              float32 [1, 19]   QM9 targets, PyG order and units
``sid``/``fid``/   int64 [1]         identifiers (system, frame, index)
``idx``
=================  ================  ==========================================

``energy``, ``forces`` and ``y`` are present only when the source has them;
the other fields are always present.

Model inputs are checked when a sample is built: NaN or infinite ``pos`` /
``cell`` (and non-integral float atomic numbers) raise
:class:`NonFiniteInputError` naming the source (``where``: file and key, row,
molecule), the sample's ``idx``/``sid``, the field and the atom. Targets
(``energy``, ``forces``, ``y``) are not checked here: a non-finite target gives
a non-finite loss, which the trainer skips (``trainer.max_bad_batches``).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import numpy as np
import torch
from torch_geometric.data import Data

__all__ = ["SAMPLE_FIELDS", "ALWAYS_FIELDS", "INPUT_FLOAT_FIELDS", "NonFiniteInputError", "make_sample", "as_tensor",
           "check_finite_inputs", "finite_samples"]

#: every field a sample may carry (CONVENTIONS.md)
SAMPLE_FIELDS = (
    "pos", "atomic_numbers", "natoms", "cell", "pbc", "fixed", "tags",
    "energy", "forces", "y", "sid", "fid", "idx",
)
#: fields every sample carries
ALWAYS_FIELDS = ("pos", "atomic_numbers", "natoms", "cell", "pbc", "fixed", "tags", "sid", "fid", "idx")
#: float fields the model reads (checked for NaN/inf by :func:`check_finite_inputs`)
INPUT_FLOAT_FIELDS = ("pos", "cell")


class NonFiniteInputError(ValueError, FloatingPointError):
    """A sample's model input (``pos``, ``cell``, atomic numbers) is NaN or infinite.

    A ``ValueError`` (bad input) and a ``FloatingPointError``, like the
    trainer's ``NonFiniteLossError``. Constructed from the message alone, so a
    DataLoader worker re-raises it in the main process with its type intact
    (and the iterator stays usable: the next batch follows).
    """


def as_tensor(value: Any, dtype: torch.dtype) -> torch.Tensor:
    """Convert a tensor / numpy array / python number to a CPU tensor of ``dtype``."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device="cpu", dtype=dtype)
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError(f"cannot convert an object array to a tensor: {value!r}")
        if not value.flags.writeable or not value.flags.c_contiguous:
            value = np.array(value, copy=True, order="C")
        return torch.from_numpy(value).to(dtype)
    return torch.as_tensor(value, dtype=dtype)


def _id(value: Any, default: int) -> torch.Tensor:
    """An identifier as int64 [1]; strings like ``"random1234"`` keep their digits."""
    if value is None:
        return torch.tensor([default], dtype=torch.long)
    if isinstance(value, (str, bytes)):
        text = value.decode() if isinstance(value, bytes) else value
        digits = "".join(ch for ch in text if ch.isdigit())
        return torch.tensor([int(digits) if digits else default], dtype=torch.long)
    return as_tensor(value, torch.long).reshape(-1)[:1]


def _sample_label(where: str, idx: Any, sid: Any) -> str:
    ids = ", ".join(f"{k} {int(v.reshape(-1)[0])}" for k, v in (("idx", idx), ("sid", sid)) if v is not None)
    return f"{where}: " + (f"sample ({ids})" if ids else "sample")


def _all_finite(t: torch.Tensor) -> bool:
    if t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64):
        return bool(np.isfinite(t.detach().numpy()).all())  # ~4x cheaper than torch for small tensors
    return bool(torch.isfinite(t).all())


def _raise_nonfinite(name: str, t: torch.Tensor, label: Callable[[], str]) -> None:
    rows = t.reshape(t.shape[0] if name == "pos" else -1, 3)  # [n, 3] atoms or [3*, 3] lattice vectors
    finite = torch.isfinite(rows).all(dim=1)  # [n]
    bad = int((~finite).nonzero()[0, 0])
    what = f"atom {bad}" if name == "pos" else f"lattice vector {bad}"
    raise NonFiniteInputError(
        f"{label()}: non-finite {name} (NaN or inf) at {what}: {rows[bad].tolist()} "
        f"({int((~finite).sum())} of {rows.shape[0]} rows bad). "
        "Fix: repair or regenerate this sample's source data, or leave the sample out (e.g. an index subset)."
    )


def check_finite_inputs(sample: Any, *, where: str = "") -> None:
    """Raise :class:`NonFiniteInputError` if ``pos`` or ``cell`` of ``sample`` has a NaN/inf.

    ``where`` names the source (e.g. ``"data.0003.lmdb key b'17'"``); the
    message adds the sample's ``idx``/``sid``, the field, the first bad atom
    (or lattice vector) and its values. Cost: one ``isfinite`` per field on CPU.
    """
    for name in INPUT_FLOAT_FIELDS:
        t = getattr(sample, name, None)
        if t is not None and torch.is_floating_point(t) and not _all_finite(t):
            _raise_nonfinite(name, t, lambda: _sample_label(where or "sample", getattr(sample, "idx", None),
                                                            getattr(sample, "sid", None)))


def _atomic_numbers(value: Any, label: Callable[[], str]) -> torch.Tensor:
    """Atomic numbers as int64 [n]; float input (old OC20 files) must hold whole numbers."""
    if isinstance(value, torch.Tensor) and not torch.is_floating_point(value):
        return value.detach().to(device="cpu", dtype=torch.long).reshape(-1)
    z = as_tensor(value, torch.float64).reshape(-1)  # [n]
    rounded = z.round()
    bad = ~torch.isfinite(z) | ((z - rounded).abs() > 1e-3)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        kind = ValueError if bool(torch.isfinite(z).all()) else NonFiniteInputError
        raise kind(
            f"{label()}: atomic_numbers[{i}] = {float(z[i])} is not a whole number "
            f"({int(bad.sum())} of {z.numel()} entries bad). Fix: store integer atomic numbers (Z = 1..118)."
        )
    return rounded.to(torch.long)


def make_sample(
    *,
    pos: Any,
    atomic_numbers: Any,
    cell: Any = None,
    pbc: Any = None,
    fixed: Any = None,
    tags: Any = None,
    energy: Any = None,
    forces: Any = None,
    y: Any = None,
    sid: Any = None,
    fid: Any = None,
    idx: Any = None,
    extra: Optional[Mapping[str, Any]] = None,
    where: str = "",
    check_finite: bool = True,
) -> Data:
    """Build the canonical sample (see module docstring).

    Missing ``cell`` -> zeros [1, 3, 3]; missing ``pbc`` -> True in all three
    directions when the cell is non-zero (OC20 slabs), else False; missing
    ``fixed``/``tags`` -> zeros; ``sid``/``fid``/``idx`` default to 0.
    Float atomic numbers (old OC20 files) are rounded to int64.
    ``extra`` adds further fields unchanged (e.g. ``pos_relaxed`` for IS2RS).
    ``where`` names the source in error messages. NaN/inf ``pos``/``cell``
    or atomic numbers raise :class:`NonFiniteInputError` (``check_finite=False``
    keeps non-finite positions and cells, for a consumer that checks whole
    batches itself, like the trainer with ``max_bad_batches``); non-integral
    float atomic numbers (beyond 1e-3) raise ``ValueError``.
    """
    pos_t = as_tensor(pos, torch.float32).reshape(-1, 3)  # [n, 3]
    n = pos_t.shape[0]
    def label() -> str:
        return _sample_label(where or "make_sample", None if idx is None else _id(idx, 0), None if sid is None else _id(sid, 0))

    z = _atomic_numbers(atomic_numbers, label)  # [n]
    if z.numel() != n:
        raise ValueError(f"atomic_numbers has {z.numel()} entries but pos has {n} rows")
    if cell is None:
        cell_t = torch.zeros(1, 3, 3)
    else:
        cell_t = as_tensor(cell, torch.float32).reshape(1, 3, 3)  # [1, 3, 3]
    for name, t in (("pos", pos_t), ("cell", cell_t)):  # INPUT_FLOAT_FIELDS
        if check_finite and not _all_finite(t):
            _raise_nonfinite(name, t, label)
    if pbc is None:
        periodic = bool(cell_t.abs().sum() > 0)
        pbc_t = torch.full((1, 3), periodic, dtype=torch.bool)
    else:
        pbc_t = as_tensor(pbc, torch.bool).reshape(1, 3)  # [1, 3]
    fixed_t = torch.zeros(n, dtype=torch.long) if fixed is None else as_tensor(fixed, torch.long).reshape(-1)
    tags_t = torch.zeros(n, dtype=torch.long) if tags is None else as_tensor(tags, torch.long).reshape(-1)
    for name, t in (("fixed", fixed_t), ("tags", tags_t)):
        if t.numel() != n:
            raise ValueError(f"{name} has {t.numel()} entries but the sample has {n} atoms")
    fields = dict(
        pos=pos_t,
        atomic_numbers=z,
        natoms=torch.tensor([n], dtype=torch.long),
        cell=cell_t,
        pbc=pbc_t,
        fixed=fixed_t,
        tags=tags_t,
    )
    if energy is not None:
        fields["energy"] = as_tensor(energy, torch.float32).reshape(1)
    if forces is not None:
        f = as_tensor(forces, torch.float32).reshape(-1, 3)  # [n, 3]
        if f.shape[0] != n:
            raise ValueError(f"forces has {f.shape[0]} rows but the sample has {n} atoms")
        fields["forces"] = f
    if y is not None:
        fields["y"] = as_tensor(y, torch.float32).reshape(1, -1)
    fields["sid"] = _id(sid, 0)
    fields["fid"] = _id(fid, 0)
    fields["idx"] = _id(idx, 0)
    if extra:
        for k, v in extra.items():
            fields[k] = v
    return Data(**fields)


def finite_samples(dataset: Any, indices: Iterable[int]) -> Iterator[Data]:
    """``dataset[i]`` for each ``i`` in ``indices``, leaving out samples that raise :class:`NonFiniteInputError`.

    For statistics over a training set (normalisers, average degree) that a
    few corrupt samples must not stop; once exhausted, one warning gives how
    many were left out and the first one's message (file, key, ids).
    """
    total, skipped, first = 0, 0, ""
    for i in indices:
        total += 1
        try:
            yield dataset[int(i)]
        except NonFiniteInputError as exc:
            skipped += 1
            first = first or str(exc).strip().splitlines()[-1]
    if skipped:
        warnings.warn(f"{skipped} of {total} samples left out (NaN/inf input); the first: {first}", stacklevel=2)
