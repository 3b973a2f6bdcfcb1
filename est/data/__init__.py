"""Data for est: one sample type (PyG ``Data``, see ``docs/CONVENTIONS.md``) from
QM9 (qm9pack CSVs, PyG raw folder, original xyz release), OC20-layout LMDB files
(fairchem's and ours), fairchem 2.x ``.aselmdb`` files and folders (read and
written), ASE databases (:func:`open_dataset` picks the reader by path), an
OC20-layout EMT dataset generator and a GFN2-xTB molecular-dynamics generator
(``est.data.xtb``, needs tblite); plus atom-balanced batching and fitted target statistics.
"""
from .sample import SAMPLE_FIELDS, ALWAYS_FIELDS, NonFiniteInputError, make_sample
from .safe_pickle import UnsafePickleError, RestrictedUnpickler, safe_loads
from .lmdb_io import (
    LmdbDataset, LmdbWriter, write_lmdb, DataFileError, CorruptRecordError, DEFAULT_KEY_MAP, check_lmdb_file,
)
from .ase_db import AseDbDataset, atoms_to_sample
from .aselmdb import AseLmdbDataset, AseLmdbWriter, write_aselmdb
from .formats import open_dataset, dataset_format, open_writer
from .qm9 import QM9, qm9_split, QM9_SIZE, STANDARD_SPLIT
from .qm9_formats import TARGET_NAMES as QM9_TARGET_NAMES, TARGET_UNITS as QM9_TARGET_UNITS
from .sampler import BalancedBatchSampler, balanced_split, get_natoms
from .stats import (
    Normalizer, LinearReference, fit_normalizer, fit_linear_reference, collect_targets, dataset_statistics,
)
from .generate import EMTConfig, default_emt_dataset, generate as generate_emt
from .molecules import MOLECULES
from .cache import default_cache_dir
from ..geometry import Graph, radius_graph  # re-exported: est.data.radius_graph

__all__ = [
    "SAMPLE_FIELDS", "ALWAYS_FIELDS", "make_sample", "NonFiniteInputError", "check_lmdb_file",
    "UnsafePickleError", "RestrictedUnpickler", "safe_loads",
    "LmdbDataset", "LmdbWriter", "write_lmdb", "DataFileError", "CorruptRecordError", "DEFAULT_KEY_MAP",
    "AseDbDataset", "atoms_to_sample", "AseLmdbDataset", "AseLmdbWriter", "write_aselmdb", "open_dataset",
    "dataset_format", "open_writer",
    "QM9", "qm9_split", "QM9_SIZE", "STANDARD_SPLIT", "QM9_TARGET_NAMES", "QM9_TARGET_UNITS",
    "BalancedBatchSampler", "balanced_split", "get_natoms",
    "Normalizer", "LinearReference", "fit_normalizer", "fit_linear_reference", "collect_targets",
    "dataset_statistics", "EMTConfig", "default_emt_dataset", "generate_emt",
    "MOLECULES", "XTBConfig", "generate_xtb",
    "default_cache_dir",
    "radius_graph", "Graph",
]


def __getattr__(name: str):
    # est.data.xtb is imported on first use, so `python -m est.data.xtb` runs it fresh (no runpy warning)
    if name in ("XTBConfig", "generate_xtb"):
        from . import xtb

        return {"XTBConfig": xtb.XTBConfig, "generate_xtb": xtb.generate}[name]
    raise AttributeError(f"module 'est.data' has no attribute {name!r}")
