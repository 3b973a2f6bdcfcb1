"""Small ASE helpers shared by the dataset generators (:mod:`est.data.generate`, :mod:`est.data.xtb`):
an S2EF record from an ``ase.Atoms`` frame, Maxwell-Boltzmann momenta across ASE versions, an
optimiser by name.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

__all__ = ["s2ef_record", "thermalize", "optimizer"]


def s2ef_record(atoms, *, energy: float, forces: np.ndarray, sid: int, fid: int,
                fixed: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
    """The OC20 S2EF record of one frame (the fields and dtypes of ``docs/CONVENTIONS.md``).

    ``tags`` come from ``atoms.get_tags()``; ``fixed`` defaults to ``tags == 0``
    (OC20: sub-surface atoms are frozen); pass zeros for molecules.
    """
    tags = atoms.get_tags().astype(np.int64)                                  # [n]
    fixed = (tags == 0).astype(np.int64) if fixed is None else np.asarray(fixed, dtype=np.int64)
    return {
        "pos": atoms.positions.astype(np.float32),                            # [n, 3]
        "atomic_numbers": atoms.numbers.astype(np.int64),                     # [n]
        "natoms": np.array([len(atoms)], dtype=np.int64),                     # [1]
        "cell": atoms.cell.array.astype(np.float32).reshape(1, 3, 3),         # [1, 3, 3]
        "pbc": np.asarray(atoms.pbc, dtype=bool).reshape(1, 3),               # [1, 3]
        "fixed": fixed,                                                       # [n]
        "tags": tags,                                                         # [n]
        "energy": np.array([energy], dtype=np.float32),                       # [1]
        "forces": np.asarray(forces).astype(np.float32),                      # [n, 3]
        "sid": np.array([sid], dtype=np.int64),                               # [1]
        "fid": np.array([fid], dtype=np.int64),                               # [1]
    }


def thermalize(atoms, temperature_K: float, rng) -> None:
    """Maxwell-Boltzmann momenta at ``temperature_K`` drawn from ``rng`` (``thermalize_momenta``, ASE >= 3.27)."""
    try:
        from ase.md.velocitydistribution import thermalize_momenta as draw
    except ImportError:  # ASE < 3.27
        from ase.md.velocitydistribution import MaxwellBoltzmannDistribution as draw
    draw(atoms, temperature_K=temperature_K, rng=rng)


def optimizer(name: str):
    """ASE optimiser class by name: ``"lbfgs"`` or ``"bfgs"``."""
    from ase.optimize import BFGS, LBFGS

    known = {"lbfgs": LBFGS, "bfgs": BFGS}
    if name.lower() not in known:
        raise ValueError(f"optimizer {name!r} is not one of {sorted(known)}")
    return known[name.lower()]
