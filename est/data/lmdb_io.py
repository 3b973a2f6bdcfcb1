"""OC20-layout LMDB files: reading fairchem's files and writing our own.

Layout (fairchem / OC20):

* S2EF: a folder of ``data.NNNN.lmdb`` files opened with ``subdir=False``;
  keys ``b"0" .. b"n-1"`` per file plus ``b"length"``; values are pickled
  PyG ``Data`` (1.x or 2.x) with ``pos``, ``cell``, ``atomic_numbers`` (float in
  old files), ``natoms``, ``tags``, ``fixed``, ``sid``, ``fid``, and the energy
  as ``y`` (2021 files) or ``energy``, forces as ``force`` or ``forces``.
* IS2RE: a single ``data.lmdb`` with ``pos``, ``pos_relaxed``, ``y_init``,
  ``y_relaxed``.

Files written by :func:`write_lmdb` use the same layout, but each value is an
array record (:mod:`est.data.arrays`: JSON header + raw numpy bytes, no
pickle), ``b"length"`` is a pickled int (no globals; what fairchem's readers
expect), ``b"natoms"`` holds the per-sample atom counts of that file, and a
folder also gets ``metadata.npz`` with ``natoms`` for all files in order (the
file fairchem's balanced sampler reads).

:class:`LmdbDataset` reads both, returning :func:`est.data.sample.make_sample`
samples. Pickled records go through :mod:`est.data.safe_pickle` unless
``trusted=True``. Files are opened read-only without a lock file: a reader
never modifies or creates anything. Before a file is mapped its size is
checked against the size its LMDB header says the data needs
(:func:`check_lmdb_file`): reading past the end of a truncated file (an
interrupted copy, a full disk) would kill the process with SIGBUS.

This module is the layout's description and the one import path for its
parts, each in a module of its own:

* :mod:`est.data.lmdb_check`: is a file LMDB, is it as long as its header says;
* :mod:`est.data.lmdb_records`: reserved keys, record fields -> sample;
* :mod:`est.data.lmdb_envs`: read-only environments shared within a process;
* :mod:`est.data.lmdb_reader`: :class:`LmdbDataset`;
* :mod:`est.data.lmdb_writer`: :class:`LmdbWriter`, :func:`write_lmdb`.
"""
from .lmdb_check import DataFileError, check_lmdb_file, is_lmdb_file
from .lmdb_reader import LmdbDataset
from .lmdb_records import DEFAULT_KEY_MAP, CorruptRecordError, record_to_sample
from .lmdb_writer import LmdbWriter, write_lmdb

__all__ = [
    "LmdbDataset", "LmdbWriter", "write_lmdb", "DataFileError", "CorruptRecordError",
    "DEFAULT_KEY_MAP", "record_to_sample", "check_lmdb_file", "is_lmdb_file",
]
