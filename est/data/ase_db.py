"""ASE databases (``ase.db``: ``.db`` SQLite, ``.json``, and ``.aselmdb`` where
``ase-db-backends`` is installed) as canonical samples, one file through ASE's
own ``connect`` (for ``.aselmdb`` files and folders read straight from LMDB,
with atom-count metadata and key maps, see :mod:`est.data.aselmdb`).

Per row: positions, numbers, cell, pbc; ``tags`` from the atoms' tags;
``fixed`` from ``FixAtoms`` constraints; ``energy``/``forces`` from the stored
calculator results when present; ``sid`` from the key-value pair ``sid``
(else the row id), ``fid`` from ``fid`` (else 0).
"""
from __future__ import annotations

import os
from typing import Any, Optional, Union

import numpy as np
from torch.utils.data import Dataset

from .lmdb_io import check_lmdb_file, is_lmdb_file
from .sample import make_sample

__all__ = ["AseDbDataset", "atoms_to_sample"]


def _fixed_mask(atoms) -> np.ndarray:
    from ase.constraints import FixAtoms

    mask = np.zeros(len(atoms), dtype=np.int64)
    for c in atoms.constraints:
        if isinstance(c, FixAtoms):
            mask[c.get_indices()] = 1
    return mask


def atoms_to_sample(atoms, *, energy=None, forces=None, sid=None, fid=None, idx=None, extra=None, where=""):
    """An ``ase.Atoms`` (with optional energy/forces) as a canonical sample (``where`` names it in errors)."""
    cell = np.asarray(atoms.cell.array, dtype=np.float64)
    return make_sample(
        pos=np.asarray(atoms.positions), atomic_numbers=np.asarray(atoms.numbers), cell=cell,
        pbc=np.asarray(atoms.pbc, dtype=bool), fixed=_fixed_mask(atoms), tags=np.asarray(atoms.get_tags()),
        energy=energy, forces=forces, sid=sid, fid=fid, idx=idx, extra=extra, where=where,
    )


class AseDbDataset(Dataset):
    """Rows of an ASE database as canonical samples.

    Args:
        path: database file (``.db``, ``.json``, ``.aselmdb``, ...).
        selection: an ``ase.db`` selection string / key-value query (default all rows).
        transform: optional callable applied to each sample.
    """

    def __init__(self, path: Union[str, os.PathLike], *, selection: Optional[Any] = None, transform=None):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"{self.path}: no such ASE database")
        if os.path.isdir(self.path):
            raise IsADirectoryError(f"{self.path} is a folder; pass an ASE database file (.db, .json, .aselmdb)")
        if is_lmdb_file(self.path):  # .aselmdb: a truncated file would crash the reader with SIGBUS
            check_lmdb_file(self.path)
        self.selection = selection
        self.transform = transform
        db = self._connect()
        ids, natoms = [], []
        try:
            rows = db.select(selection) if selection is not None else db.select()
            for row in rows:
                ids.append(row.id)
                natoms.append(row.natoms)
        except Exception as exc:
            raise ValueError(f"{self.path}: cannot read rows ({type(exc).__name__}: {exc})") from None
        self.ids = np.asarray(ids, dtype=np.int64)
        self._natoms = np.asarray(natoms, dtype=np.int64)
        self._db = None
        self._pid = None

    def _connect(self):
        import ase.db

        try:
            if self.path.endswith(".db"):
                # read-only SQLite connection: a reader never modifies the file
                import sqlite3
                from urllib.parse import quote

                db = ase.db.connect(self.path, type="db", create_indices=False, use_lock_file=False)
                uri = "file:" + quote(os.path.abspath(self.path)) + "?mode=ro"
                db._connect = lambda: sqlite3.connect(uri, uri=True, timeout=20)
                return db
            return ase.db.connect(self.path, use_lock_file=False)
        except Exception as exc:
            hint = ""
            if self.path.endswith(".aselmdb"):
                hint = (" Reading .aselmdb through ASE needs its LMDB backend (pip install ase-db-backends); "
                        "est.data.AseLmdbDataset reads it without.")
            raise ValueError(f"{self.path}: cannot open as an ASE database ({type(exc).__name__}: {exc}).{hint}") from None

    def _handle(self):
        if self._db is None or self._pid != os.getpid():
            self._db = self._connect()
            self._pid = os.getpid()
        return self._db

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_db"] = None
        return state

    @property
    def natoms(self) -> np.ndarray:
        return self._natoms

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        rid = int(self.ids[i])
        try:
            row = self._handle().get(id=rid)
        except Exception as exc:
            raise ValueError(f"{self.path}: row id {rid} cannot be read ({type(exc).__name__}: {exc})") from None
        atoms = row.toatoms()
        kv = row.key_value_pairs
        sample = atoms_to_sample(
            atoms,
            energy=row.get("energy"),
            forces=row.get("forces"),
            sid=kv.get("sid", rid),
            fid=kv.get("fid", 0),
            idx=int(i),
            where=f"{self.path} row id {rid}",
        )
        return self.transform(sample) if self.transform is not None else sample

    def __repr__(self) -> str:
        return f"AseDbDataset({self.path!r}, rows={len(self)})"
