"""One entry point for data files: the reader is chosen by the path.

=====================================================  ===========================================
path                                                   reader
=====================================================  ===========================================
``*.aselmdb`` file, or a folder of ``*.aselmdb``       :class:`~est.data.aselmdb.AseLmdbDataset`
``*.db`` / ``*.json`` file (ASE database)              :class:`~est.data.ase_db.AseDbDataset`
``*.lmdb`` file, or a folder of ``*.lmdb`` (OC20)      :class:`~est.data.lmdb_io.LmdbDataset`
=====================================================  ===========================================

A folder holding both ``*.aselmdb`` and ``*.lmdb`` files is refused (which set is meant is not clear).

Writing: :func:`open_writer` gives the writer of a file format (``"lmdb"``:
:class:`~est.data.lmdb_io.LmdbWriter`, ``"aselmdb"``:
:class:`~est.data.aselmdb.AseLmdbWriter`, which needs ``ase-db-backends``); both
take ``add(sample)``, ``close()``, ``abort()`` and work as context managers, so
the generators (``est.data.generate``, ``est.data.xtb``) write either format
through this one function.
"""
from __future__ import annotations

import glob
import os
from typing import Any, Mapping, Optional, Sequence, Union

from .lmdb_io import DataFileError

__all__ = ["open_dataset", "dataset_format", "open_writer", "WRITE_FORMATS", "SUFFIXES"]

#: file formats the generators write, and their file suffixes
WRITE_FORMATS = ("lmdb", "aselmdb")
SUFFIXES = {"lmdb": ".lmdb", "aselmdb": ".aselmdb"}


def dataset_format(path: Union[str, os.PathLike]) -> str:
    """``"aselmdb"``, ``"ase_db"`` or ``"lmdb"`` for ``path`` (see module docstring)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        has_ase = bool(glob.glob(os.path.join(path, "*.aselmdb")))
        has_lmdb = bool(glob.glob(os.path.join(path, "*.lmdb")))
        if has_ase and has_lmdb:
            raise DataFileError(f"{path}: folder holds both *.aselmdb and *.lmdb files. Fix: keep one format per folder.")
        return "aselmdb" if has_ase else "lmdb"
    if path.endswith(".aselmdb"):
        return "aselmdb"
    if path.endswith((".db", ".json")):
        return "ase_db"
    return "lmdb"


def open_dataset(path: Union[str, os.PathLike], *, key_map: Optional[Mapping[str, Any]] = None, trusted: bool = False,
                 check_finite: bool = True, extra_fields: Optional[Sequence[str]] = None):
    """The dataset of ``path`` with the reader its format needs (see module docstring).

    ``key_map`` (sample field -> record key(s)) applies to LMDB and ``.aselmdb`` records;
    ``trusted`` to pickled OC20 LMDB records; ``extra_fields`` (record keys kept as sample
    fields) default to each reader's own.
    """
    kind = dataset_format(path)
    if kind == "aselmdb":
        from .aselmdb import AseLmdbDataset

        kw = {} if extra_fields is None else {"extra_fields": tuple(extra_fields)}
        return AseLmdbDataset(path, key_map=key_map, check_finite=check_finite, **kw)
    if kind == "ase_db":
        from .ase_db import AseDbDataset

        if key_map:
            raise ValueError(f"{path}: key_map is not supported for ASE .db/.json files. Fix: convert them to "
                             ".aselmdb (est.data.write_aselmdb) or drop data.key_map.")
        return AseDbDataset(path)
    from .lmdb_io import LmdbDataset

    return LmdbDataset(path, key_map=key_map, trusted=trusted, check_finite=check_finite,
                       extra_fields=tuple(extra_fields or ()))


def open_writer(path: Union[str, os.PathLike], file_format: str = "lmdb", *, samples_per_shard: int = 10_000,
                overwrite: bool = False):
    """A writer of ``file_format`` for ``path`` (see module docstring).

    ``path`` ending in the format's suffix (:data:`SUFFIXES`) is one file; any other path a folder
    of ``data.NNNN<suffix>`` files of ``samples_per_shard`` samples each plus ``metadata.npz``.
    """
    if file_format not in WRITE_FORMATS:
        raise ValueError(f"file format {file_format!r} is not one est writes; choose one of {WRITE_FORMATS}")
    if file_format == "aselmdb":
        from .aselmdb import AseLmdbWriter

        return AseLmdbWriter(path, overwrite=overwrite, rows_per_file=samples_per_shard)
    from .lmdb_io import LmdbWriter

    return LmdbWriter(path, overwrite=overwrite, samples_per_shard=samples_per_shard)
