"""fairchem 2.x ``.aselmdb`` datasets (ASE's LMDB database backend, package ``ase-db-backends``).

Format (one file = one ASE database): a single-file LMDB (``subdir=False``);
row ``id`` (1, 2, ...) under the ASCII key ``str(id)``, its value
``zlib.compress(ase.io.jsonio.encode(row))`` with ``numbers``, ``positions``,
``cell``, ``pbc``, ``tags``, ``constraints``, the calculator's ``energy`` /
``forces`` / ``stress``, ``key_value_pairs`` and ``data``; reserved keys
``nextid``, ``deleted_ids`` (rows are ``range(1, nextid)`` minus those) and
``metadata`` (a JSON dict). A dataset is one file or a folder of ``*.aselmdb``
files (OMat24, OMol25, the OC20/OC22 re-releases, ODAC), read in name order.

Reading (:class:`AseLmdbDataset`) needs only ``lmdb`` and ASE: files are mapped
read-only without a lock file by :mod:`est.data.lmdb_io`'s shared opener
(checked for truncation first, reopened in every DataLoader worker / DDP
process), so nothing is ever written into the data folder. A row becomes a
record (``pos``, ``atomic_numbers``, ``cell``, ``pbc``, ``tags``, ``fixed``
from ``FixAtoms`` constraints, ``energy``, ``forces``, ``stress`` [1, 3, 3],
then the row's key-value pairs and ``data`` entries under their own names)
that the same key map as :class:`~est.data.LmdbDataset` turns into a sample
(e.g. ``key_map={"energy": "omat_energy"}``); ``extra_fields`` (default
``charge``, ``spin``, ``stress``) are carried as sample fields when a row has
them. ``sid``/``fid`` come from key-value pairs or data of those names, else
the sample's global index / 0.

Atom counts for balanced batching, cheapest first: each file's ``metadata``
``{"natoms": [...]}`` (written by :class:`AseLmdbWriter`), a ``metadata.npz``
with ``natoms`` next to the files (fairchem's convention), else an index built
once by reading each row's ``numbers`` header (decompression, no JSON decode)
and cached per file (path, size, mtime) under the cache folder
(:func:`est.data.cache.default_cache_dir`), never in the data folder.

Writing (:class:`AseLmdbWriter`, :func:`write_aselmdb`) goes through
``ase-db-backends`` itself (``pip install ase-db-backends`` or the
``est[aselmdb]`` extra), so the files are what fairchem and ASE read.
"""
from __future__ import annotations

import glob
import os
import re
import warnings
import zlib
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from torch.utils.data import Dataset

from .cache import atomic_savez, cache_key, default_cache_dir, file_signature
from .lmdb_io import CorruptRecordError, DataFileError, LmdbDataset, LmdbWriter, record_to_sample
from .lmdb_records import merge_key_map as _merge_key_map

__all__ = ["AseLmdbDataset", "AseLmdbWriter", "write_aselmdb", "aselmdb_files", "is_aselmdb_path", "SUFFIX"]

SUFFIX = ".aselmdb"
RESERVED_KEYS = (b"nextid", b"deleted_ids", b"metadata")
#: record keys every row maps to (the rest of a row's key-value pairs and data keep their names)
_STRUCTURE_KEYS = ("pos", "atomic_numbers", "cell", "pbc", "tags", "fixed", "energy", "forces", "stress")
_NUMBERS_HEADER = re.compile(rb'"numbers":\s*\{"__ndarray__":\s*\[\[(\d+)\]')
_INDEX_VERSION = 1


def is_aselmdb_path(path: Union[str, os.PathLike]) -> bool:
    """Whether ``path`` is an ``.aselmdb`` file or a folder holding ``*.aselmdb`` files."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return bool(glob.glob(os.path.join(path, "*" + SUFFIX)))
    return path.endswith(SUFFIX)


def aselmdb_files(path: Union[str, os.PathLike]) -> List[str]:
    """The ``.aselmdb`` files of ``path`` (a file, or a folder's ``*.aselmdb`` in name order)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataFileError(f"{path}: no such file or folder (expected an .aselmdb file or a folder of them)")
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*" + SUFFIX)))
        if not files:
            raise DataFileError(f"{path}: folder holds no *{SUFFIX} files")
        return files
    return [path]


def _decode(raw: bytes, where: str) -> Any:
    from ase.io.jsonio import decode

    try:
        return decode(zlib.decompress(raw).decode("utf-8"))
    except Exception as exc:
        raise CorruptRecordError(f"{where}: cannot decode ({type(exc).__name__}: {exc}); the file is corrupt "
                                 "or not an ASE LMDB database") from None


def _row_ids(txn, f: str) -> List[int]:
    """Row ids of one open file: ``range(1, nextid)`` minus ``deleted_ids``."""
    raw_next = txn.get(b"nextid")
    nextid = 1 if raw_next is None else int(_decode(raw_next, f"{f} key b'nextid'"))
    raw_del = txn.get(b"deleted_ids")
    deleted = set() if raw_del is None else {int(i) for i in _decode(raw_del, f"{f} key b'deleted_ids'")}
    return [i for i in range(1, nextid) if i not in deleted]


def _fixed(constraints: Optional[Sequence[Mapping[str, Any]]], n: int) -> np.ndarray:
    """Per-atom 1/0 for atoms frozen by ``FixAtoms`` (other constraints do not freeze whole atoms)."""
    mask = np.zeros(n, dtype=np.int64)
    for c in constraints or ():
        if c.get("name") == "FixAtoms":
            from ase.constraints import dict2constraint

            mask[dict2constraint(dict(c)).get_indices()] = 1
    return mask


def _stress_3x3(s: Any) -> np.ndarray:
    """ASE stress (Voigt xx yy zz yz xz xy, or 3x3) as [1, 3, 3]."""
    s = np.asarray(s, dtype=np.float64).reshape(-1)
    if s.size == 9:
        return s.reshape(1, 3, 3)
    xx, yy, zz, yz, xz, xy = s
    return np.array([[[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]]])


def row_to_record(row: Mapping[str, Any]) -> Dict[str, Any]:
    """A decoded row dict as a record: data, then key-value pairs, then the structure (later keys win)."""
    numbers = np.asarray(row["numbers"])
    record: Dict[str, Any] = {}
    record.update(row.get("data") or {})
    record.update(row.get("key_value_pairs") or {})
    record.update(
        pos=np.asarray(row["positions"], dtype=np.float64), atomic_numbers=numbers,
        cell=np.asarray(row.get("cell", np.zeros((3, 3))), dtype=np.float64),
        pbc=np.asarray(row.get("pbc", np.zeros(3, bool)), dtype=bool),
        tags=np.asarray(row.get("tags", np.zeros(len(numbers))), dtype=np.int64),
        fixed=_fixed(row.get("constraints"), len(numbers)),
    )
    for key in ("energy", "forces"):
        if row.get(key) is not None:
            record[key] = np.asarray(row[key], dtype=np.float64)
    if row.get("stress") is not None:
        record["stress"] = _stress_3x3(row["stress"]).astype(np.float32)  # float32 like the other float fields
    return record


def _as_field(value: Any) -> Any:
    """A scalar or list from a row as an array with a leading sample axis (batches to [B, ...])."""
    if isinstance(value, (bool, int, float, np.number, list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 0):
        arr = np.asarray(value)
        return arr.reshape(1, *arr.shape) if arr.ndim else arr.reshape(1)
    return value


class AseLmdbDataset(Dataset):
    """Rows of one ``.aselmdb`` file or a folder of them as canonical samples (see module docstring).

    Args:
        path: an ``.aselmdb`` file or a folder holding ``*.aselmdb`` files.
        key_map: ``{sample_field: key or [keys]}`` over the record (structure, key-value pairs, data),
            as for :class:`~est.data.LmdbDataset` (e.g. ``{"energy": "omat_energy"}``).
        extra_fields: record keys carried as sample fields when present.
        transform: optional callable applied to each sample.
        check_finite: raise for NaN/inf positions or cells (``False``: leave it to the trainer).
        cache_dir: where the atom-count index of files without ``natoms`` metadata is cached
            (default :func:`~est.data.cache.default_cache_dir`); ``False`` keeps it in memory only.
    """

    def __init__(self, path: Union[str, os.PathLike], *, key_map: Optional[Mapping[str, Any]] = None,
                 extra_fields: Sequence[str] = ("charge", "spin", "stress"), transform=None, check_finite: bool = True,
                 cache_dir: Union[str, bool, None] = None):
        self.path = os.fspath(path)
        self.files = aselmdb_files(self.path)
        self.key_map = _merge_key_map(key_map)
        self.extra_fields = tuple(extra_fields)
        self.transform = transform
        self.check_finite = check_finite
        self.cache_dir = cache_dir
        self._envs: Dict[int, Any] = {}
        self._pid = os.getpid()
        self.ids: List[np.ndarray] = []
        stored: List[Optional[np.ndarray]] = []
        for i, f in enumerate(self.files):
            with self._env(i).begin() as txn:
                ids = np.asarray(_row_ids(txn, f), dtype=np.int64)
                raw_meta = txn.get(b"metadata")
            meta = _decode(raw_meta, f"{f} key b'metadata'") if raw_meta is not None else {}
            nat = meta.get("natoms") if isinstance(meta, dict) else None
            stored.append(np.asarray(nat, dtype=np.int64).reshape(-1) if nat is not None and len(nat) == len(ids) else None)
            self.ids.append(ids)
        self.lengths = [len(ids) for ids in self.ids]
        self._offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        if len(self) == 0:
            raise DataFileError(f"{self.path}: no rows in {len(self.files)} .aselmdb file(s) (all empty or deleted)")
        self._stored = stored
        self._natoms: Optional[np.ndarray] = None
        if all(s is not None for s in stored):
            self._natoms = np.concatenate(stored)
        else:
            self._natoms = self._metadata_npz()
        self._close()

    # -- files: per-process read-only environments, pickling for workers and metadata.npz, as LmdbDataset's
    _env = LmdbDataset._env
    _close = LmdbDataset._close
    __getstate__ = LmdbDataset.__getstate__
    __del__ = LmdbDataset.__del__
    _metadata_npz = LmdbDataset._metadata_natoms

    # -- atom counts
    def _count_file(self, i: int) -> np.ndarray:
        """Atoms per row of file ``i`` from the ``numbers`` header of each (decompressed) row."""
        f = self.files[i]
        out = np.empty(self.lengths[i], dtype=np.int64)
        with self._env(i).begin() as txn:
            for k, rid in enumerate(self.ids[i].tolist()):
                raw = txn.get(str(rid).encode())
                if raw is None:
                    raise CorruptRecordError(f"{f} row id {rid}: missing although not in deleted_ids")
                head = zlib.decompressobj().decompress(raw, 4096)
                m = _NUMBERS_HEADER.search(head)
                out[k] = int(m.group(1)) if m else len(_decode(raw, f"{f} row id {rid}")["numbers"])
        return out

    def _file_natoms(self, i: int) -> np.ndarray:
        if self._stored[i] is not None:
            return self._stored[i]
        if self.cache_dir is False:
            return self._count_file(i)
        sig = dict(file_signature(self.files[i]), version=_INDEX_VERSION, rows=self.lengths[i])
        cache = os.path.join(default_cache_dir(self.cache_dir or None), "aselmdb-index", cache_key(sig) + ".npz")
        if os.path.isfile(cache):
            try:
                with np.load(cache, allow_pickle=False) as z:
                    arr = np.asarray(z["natoms"], dtype=np.int64)
                if arr.shape[0] == self.lengths[i]:
                    return arr
            except Exception:  # a damaged cache file is rebuilt
                pass
        arr = self._count_file(i)
        try:
            atomic_savez(cache, natoms=arr)
        except OSError as exc:  # a read-only cache folder: keep the index in memory
            warnings.warn(f"cannot cache the atom counts of {self.files[i]} in {cache} ({exc}); kept in memory")
        return arr

    @property
    def natoms(self) -> np.ndarray:
        """Atoms per row: stored metadata, else the cached index (built on first use)."""
        if self._natoms is None:
            self._natoms = np.concatenate([self._file_natoms(i) for i in range(len(self.files))])
        return self._natoms

    # -- rows
    def __len__(self) -> int:
        return int(self._offsets[-1])

    def locate(self, index: int) -> Tuple[int, bytes]:
        """``(file, key)`` of global row ``index`` (the key is the row id as ASCII)."""
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} rows in {self.path}")
        i = int(np.searchsorted(self._offsets, index, side="right")) - 1
        return i, str(int(self.ids[i][index - int(self._offsets[i])])).encode()

    def get_record(self, index: int) -> Dict[str, Any]:
        """The record of row ``index``: structure, key-value pairs and data under their names."""
        i, key = self.locate(index)
        where = f"{self.files[i]} row id {key.decode()}"
        with self._env(i).begin() as txn:
            raw = txn.get(key)
        if raw is None:
            raise CorruptRecordError(f"{where}: missing although not in deleted_ids; the file is corrupt")
        row = _decode(raw, where)
        if not isinstance(row, dict) or "numbers" not in row or "positions" not in row:
            raise CorruptRecordError(f"{where}: not an ASE row (keys: {sorted(row) if isinstance(row, dict) else type(row)})")
        return row_to_record(row)

    def __getitem__(self, index: int):
        index = int(index)
        if index < 0:
            index += len(self)
        record = self.get_record(index)
        i, key = self.locate(index)
        record.setdefault("sid", index)
        for name in self.extra_fields:
            if name in record and record[name] is not None:
                record[name] = _as_field(record[name])
        sample = record_to_sample(record, index=index, key_map=self.key_map, extra_fields=self.extra_fields,
                                  where=f"{self.files[i]} row id {key.decode()}", check_finite=self.check_finite)
        return self.transform(sample) if self.transform is not None else sample

    def __repr__(self) -> str:
        return f"AseLmdbDataset({self.path!r}, files={len(self.files)}, rows={len(self)})"


# --------------------------------------------------------------------------- writing


def _field(fields: Mapping[str, Any], name: str) -> Optional[np.ndarray]:
    v = fields.get(name)
    if v is None:
        return None
    if hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    return np.asarray(v)


def _plain(value: Any) -> Any:
    """Tensors and 1-element arrays as numpy / python values ASE's JSON encoder takes."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "biuf":
        return value.reshape(-1)[0].item()
    return value


def sample_to_atoms(sample: Any):
    """A canonical sample (PyG ``Data`` or dict of arrays) as ``(ase.Atoms, key_value_pairs, data)``.

    Energy, forces and stress go to a ``SinglePointCalculator``, ``fixed`` to ``FixAtoms``, ``tags`` to the
    atoms' tags, ``sid``/``fid`` to key-value pairs; every other field (``y``, ``pos_relaxed``, ``y_relaxed``,
    ``charge``, ...) to the row's ``data``.
    """
    from ase import Atoms
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.constraints import FixAtoms

    fields = dict(sample.items()) if hasattr(sample, "items") else dict(sample)
    pos, z = _field(fields, "pos"), _field(fields, "atomic_numbers")
    if pos is None or z is None:
        raise ValueError(f"a sample to write needs 'pos' and 'atomic_numbers' (fields: {sorted(fields)})")
    pos = pos.reshape(-1, 3).astype(np.float64)
    cell = _field(fields, "cell")
    pbc = _field(fields, "pbc")
    atoms = Atoms(numbers=z.reshape(-1).astype(np.int64), positions=pos,
                  cell=np.zeros((3, 3)) if cell is None else cell.reshape(3, 3).astype(np.float64),
                  pbc=False if pbc is None else pbc.reshape(3).astype(bool))
    tags = _field(fields, "tags")
    if tags is not None:
        atoms.set_tags(tags.reshape(-1).astype(np.int64))
    fixed = _field(fields, "fixed")
    if fixed is not None and fixed.any():
        atoms.set_constraint(FixAtoms(indices=np.nonzero(fixed.reshape(-1))[0]))
    results: Dict[str, Any] = {}
    energy, forces, stress = (_field(fields, k) for k in ("energy", "forces", "stress"))
    if energy is not None:
        results["energy"] = float(energy.reshape(-1)[0])
    if forces is not None:
        results["forces"] = forces.astype(np.float64).reshape(-1, 3)
    if stress is not None:
        results["stress"] = stress.astype(np.float64).reshape(3, 3)
    if results:
        atoms.calc = SinglePointCalculator(atoms, **results)
    kvp = {k: _plain(fields[k]) for k in ("sid", "fid") if fields.get(k) is not None}
    skip = set(_STRUCTURE_KEYS) | {"natoms", "idx", "sid", "fid", "batch", "ptr"}
    data = {k: _plain(v) for k, v in fields.items() if k not in skip and v is not None}
    return atoms, kvp, data


class AseLmdbWriter(LmdbWriter):
    """Stream structures into ``.aselmdb`` through ``ase-db-backends`` (ASE's LMDB database).

    ``path`` ending in ``.aselmdb`` -> one file; otherwise a folder of ``data.NNNN.aselmdb`` files of
    ``rows_per_file`` rows each plus ``metadata.npz`` (``natoms``). Each file's ``metadata`` holds
    ``{"natoms": [...]}``, so readers get atom counts without decoding rows. As :class:`LmdbWriter`
    (whose temporary-name, close and abort logic it shares): written under a temporary name and moved
    into place by :meth:`close`; an existing ``path`` is refused unless ``overwrite``.
    :meth:`add` takes an ``ase.Atoms`` (its calculator results, constraints, tags and ``info`` as data)
    or a canonical sample / dict of arrays (:func:`sample_to_atoms`).
    """

    def __init__(self, path: Union[str, os.PathLike], *, overwrite: bool = False, rows_per_file: int = 10_000):
        try:
            from ase_db_backends.aselmdb import LMDBDatabase  # noqa: F401
        except ImportError:
            raise ImportError("writing .aselmdb needs ASE's LMDB backend. Fix: pip install ase-db-backends "
                              "(or pip install 'est[aselmdb]')") from None
        super().__init__(path, overwrite=overwrite, samples_per_shard=rows_per_file)
        if self.path.endswith(SUFFIX):  # one file: LmdbWriter made the temporary folder of a sharded set
            os.rmdir(self.tmp)
            self.single = True

    def _shard_path(self, shard: int) -> str:
        return self.tmp if self.single else os.path.join(self.tmp, f"data.{shard:04d}{SUFFIX}")

    def _open_shard(self) -> None:
        from ase_db_backends.aselmdb import LMDBDatabase

        self._shard += 1
        self._shard_natoms = []
        self._env = LMDBDatabase(self._shard_path(self._shard), use_lock_file=False)

    def _finish_shard(self) -> None:
        if self._env is None:
            return
        self._env.metadata = {"natoms": list(self._shard_natoms)}
        self._env.close()
        self._env = None
        lock = self._shard_path(self._shard) + "-lock"
        if os.path.exists(lock):
            os.remove(lock)

    def add(self, item: Any, *, key_value_pairs: Optional[Mapping[str, Any]] = None,
            data: Optional[Mapping[str, Any]] = None) -> int:
        """Append one structure; returns its global index."""
        if self._closed:
            raise RuntimeError("writer is closed")
        from ase import Atoms

        if isinstance(item, Atoms):
            atoms, kvp, extra = item, {}, dict(item.info)
        else:
            atoms, kvp, extra = sample_to_atoms(item)
        if not np.isfinite(atoms.positions).all() or not np.isfinite(atoms.cell.array).all():
            raise ValueError(f"{self.path}: structure {len(self.natoms)} (to write) has NaN/inf positions or cell")
        kvp.update(key_value_pairs or {})
        extra.update(data or {})
        if self._env is None or (not self.single and len(self._shard_natoms) >= self.samples_per_shard):
            self._finish_shard()
            self._open_shard()
        self._env.write(atoms, key_value_pairs=kvp, data=extra)
        self._shard_natoms.append(len(atoms))
        self.natoms.append(len(atoms))
        return len(self.natoms) - 1


def write_aselmdb(path: Union[str, os.PathLike], items: Iterable[Any], *, overwrite: bool = False,
                  rows_per_file: int = 10_000) -> int:
    """Write structures (``ase.Atoms`` or canonical samples) to an ``.aselmdb`` file or folder; returns the count."""
    with AseLmdbWriter(path, overwrite=overwrite, rows_per_file=rows_per_file) as w:
        for item in items:
            w.add(item)
        n = len(w)
    return n
