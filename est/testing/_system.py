"""One structure for the whole-model checks: :class:`System` and the symmetry operations on it.

:func:`as_system` reads a ``torch_geometric`` Data (est conventions), an
``ase.Atoms``, a dict or a ``(positions, numbers, cell, pbc)`` tuple into
float64 positions ``[n, 3]``, atomic numbers ``[n]``, an optional cell
``[3, 3]`` (rows are lattice vectors), ``pbc [3]`` and per-atom extras
(``fixed``, ``tags``). A :class:`System` is rotated, translated, permuted or
doubled along a lattice vector into a new one; it is never changed in place.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import torch

__all__ = ["System", "as_system"]

_PER_ATOM_FIELDS = ("fixed", "tags")


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
