"""OC20 LMDB records: the reserved keys of a file and the mapping of a decoded record's fields to a sample.

A record is a dict of fields (a decoded PyG ``Data``, or one of our array
records); :data:`DEFAULT_KEY_MAP` names, for each canonical sample field, the
record keys that may hold it (fairchem's files spell the same thing several
ways), and :func:`record_to_sample` picks them into
:func:`est.data.sample.make_sample`. Besides the numbered records, a file
holds ``b"length"`` (the sample count) and, in files we wrote, ``b"natoms"``
and ``b"__est_meta__"``.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from .sample import make_sample

__all__ = ["CorruptRecordError", "DEFAULT_KEY_MAP", "record_to_sample", "merge_key_map",
           "META_KEY", "NATOMS_KEY", "LENGTH_KEY"]

META_KEY = b"__est_meta__"
NATOMS_KEY = b"natoms"
LENGTH_KEY = b"length"


class CorruptRecordError(ValueError):
    """A record (one key of one file) cannot be decoded."""


#: sample field -> candidate keys in a record, first present wins
DEFAULT_KEY_MAP: Dict[str, Sequence[str]] = {
    "pos": ("pos",),
    "atomic_numbers": ("atomic_numbers", "z"),
    "cell": ("cell",),
    "pbc": ("pbc",),
    "fixed": ("fixed",),
    "tags": ("tags",),
    "energy": ("energy", "y", "y_relaxed"),
    "forces": ("forces", "force"),
    "y": ("y",),
    "sid": ("sid",),
    "fid": ("fid",),
}


def merge_key_map(key_map: Optional[Mapping[str, Union[str, Sequence[str]]]]) -> Dict[str, Sequence[str]]:
    merged = dict(DEFAULT_KEY_MAP)
    for field, keys in (key_map or {}).items():
        if field not in merged:
            raise ValueError(f"key_map: unknown sample field {field!r}; known: {sorted(merged)}")
        merged[field] = (keys,) if isinstance(keys, str) else tuple(keys)
    return merged


def _numel(value: Any) -> int:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return int(value.size if isinstance(value, np.ndarray) else value.numel())
    return 1


def record_to_sample(
    record: Mapping[str, Any],
    *,
    index: int,
    key_map: Optional[Mapping[str, Sequence[str]]] = None,
    extra_fields: Sequence[str] = (),
    where: str = "",
    check_finite: bool = True,
):
    """Map a decoded record (dict of fields) to the canonical sample."""
    km = merge_key_map(None) if key_map is None else key_map
    picked: Dict[str, Any] = {}
    for field, candidates in km.items():
        for key in candidates:
            value = record.get(key)
            if value is None:
                continue
            if field == "energy" and key == "y" and _numel(value) != 1:
                continue  # a QM9-style target vector, not an energy
            if field == "y" and _numel(value) == 1 and "y" in km.get("energy", ()):
                continue  # an OC20 energy stored as y
            picked[field] = value
            break
    for required in ("pos", "atomic_numbers"):
        if required not in picked:
            raise CorruptRecordError(
                f"{where}: record has no {required!r} (looked for {list(km[required])}; "
                f"record keys: {sorted(record)}); pass key_map={{'{required}': '<key>'}} if it is stored under another name"
            )
    extra = {}
    for name in extra_fields:
        if name in record and record[name] is not None:
            v = record[name]
            extra[name] = torch.as_tensor(v) if isinstance(v, np.ndarray) else v
    return make_sample(idx=index, extra=extra, where=where, check_finite=check_finite, **picked)
