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
"""
from __future__ import annotations

import bisect
import glob
import json
import os
import pickle
import shutil
import struct
import warnings
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import lmdb
import numpy as np
import torch
from torch.utils.data import Dataset

from .arrays import RecordFormatError, decode_arrays, encode_arrays, is_array_record
from .safe_pickle import UnsafePickleError, pyg_to_dict, safe_loads
from .sample import make_sample

__all__ = [
    "LmdbDataset", "LmdbWriter", "write_lmdb", "DataFileError", "CorruptRecordError",
    "DEFAULT_KEY_MAP", "record_to_sample", "check_lmdb_file", "is_lmdb_file",
]

META_KEY = b"__est_meta__"
NATOMS_KEY = b"natoms"
LENGTH_KEY = b"length"


class DataFileError(OSError):
    """A data file or folder is missing, empty, or not what it should be."""


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


def _merge_key_map(key_map: Optional[Mapping[str, Union[str, Sequence[str]]]]) -> Dict[str, Sequence[str]]:
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
    km = _merge_key_map(None) if key_map is None else key_map
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


# --------------------------------------------------------------------------- file check

#: LMDB meta page (lmdb.h, 64-bit little-endian builds): a 16-byte page header
#: (pgno u64, pad u16, flags u16, lower u16, upper u16), then MDB_meta: magic
#: u32, version u32, address u64, mapsize u64, two 48-byte MDB_db records (the
#: first one's leading u32 holds the page size), last used page u64, txnid u64
_LMDB_MAGIC = 0xBEEFC0DE
_META_MAGIC_AT = 16
_META_PSIZE_AT = 40
_META_LASTPG_AT = 136
_META_END = 152
_PAGE_SIZES = tuple(1 << k for k in range(9, 17))  # 512 .. 65536 bytes


def _read_meta(head: bytes, at: int) -> Optional[Tuple[int, int, int]]:
    """(page size, last used page, txnid) of the meta page at byte ``at``, or None if it is not one."""
    if len(head) < at + _META_END or struct.unpack_from("<I", head, at + _META_MAGIC_AT)[0] != _LMDB_MAGIC:
        return None
    (psize,) = struct.unpack_from("<I", head, at + _META_PSIZE_AT)
    last_pg, txnid = struct.unpack_from("<QQ", head, at + _META_LASTPG_AT)
    return psize, last_pg, txnid


def _read_head(path: str) -> Tuple[int, Optional[Tuple[int, int, int]], Optional[Tuple[int, int, int]]]:
    """(file size, meta page 0, meta page 1) of ``path``; a meta is None where there is none."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            meta0 = _read_meta(fh.read(_META_END), 0)
            if meta0 is None or meta0[0] not in _PAGE_SIZES:
                return size, meta0, None
            fh.seek(meta0[0])
            return size, meta0, _read_meta(fh.read(_META_END), 0)
    except OSError as exc:
        raise DataFileError(f"{path}: cannot read ({exc.strerror or exc}); check the path and its permissions") from None


def is_lmdb_file(path: str) -> bool:
    """Whether ``path`` starts with an LMDB meta page (e.g. an ``.aselmdb`` file)."""
    try:
        with open(path, "rb") as fh:
            return _read_meta(fh.read(_META_END), 0) is not None
    except OSError:
        return False


def check_lmdb_file(path: str) -> int:
    """Check that LMDB file ``path`` is as long as its header says; return the bytes it needs.

    LMDB keeps two meta pages at the start of the file (pages 0 and 1); the
    one with the larger transaction id is current, and its last used page
    ``p`` and page size ``s`` give the size the data needs, ``(p + 1) * s``.
    A shorter file would be mapped and then crash the reader with SIGBUS on
    the first access past its end, so it is refused with
    :class:`DataFileError` naming the file and both sizes.
    """
    size, meta0, meta1 = _read_head(path)
    if meta0 is None or meta0[0] not in _PAGE_SIZES:
        what = "no LMDB header at the start" if meta0 is None else f"page size {meta0[0]} in its header"
        raise DataFileError(f"{path}: not an LMDB file ({size:,} bytes, {what}); is it a corrupt or non-LMDB file? "
                            "Fix: copy the file again or regenerate it")
    psize = meta0[0]
    _, last_pg, txnid = max((m for m in (meta0, meta1) if m is not None and m[0] == psize), key=lambda m: m[2])
    need = max(last_pg + 1, 2) * psize
    if size < need:
        raise DataFileError(
            f"{path}: truncated LMDB file: {size:,} bytes, but its header (transaction {txnid}) says the data fills "
            f"{max(last_pg + 1, 2):,} pages of {psize} bytes = {need:,} bytes. An interrupted copy or a full disk? "
            "Reading it would crash the process (SIGBUS). Fix: copy the file again (check free disk space) "
            "or regenerate it."
        )
    return need


# --------------------------------------------------------------------------- reading


# py-lmdb refuses to open one file twice in a process, so read-only environments
# are shared between datasets (per process, reference-counted)
_SHARED_ENVS: Dict[Tuple[int, str, int], List[Any]] = {}


def _env_key(path: str) -> Tuple[int, str, int]:
    real = os.path.realpath(path)
    try:
        ino = os.stat(real).st_ino
    except OSError:
        ino = -1
    return (os.getpid(), real, ino)


def _drop_inherited() -> None:
    """After a fork, close (in this process only) the environments the parent opened."""
    pid = os.getpid()
    for key in [k for k in _SHARED_ENVS if k[0] != pid]:
        env = _SHARED_ENVS.pop(key)[0]
        try:
            env.close()
        except Exception:
            pass


def _open_readonly(path: str) -> lmdb.Environment:
    _drop_inherited()
    key = _env_key(path)
    entry = _SHARED_ENVS.get(key)
    if entry is not None:
        entry[1] += 1
        return entry[0]
    check_lmdb_file(path)
    try:
        env = lmdb.open(
            path, subdir=False, readonly=True, lock=False, readahead=False,
            meminit=False, max_readers=2048,
        )
    except lmdb.Error as exc:
        raise DataFileError(f"{path}: cannot open as an LMDB file ({exc}); is it a corrupt or non-LMDB file?") from None
    _SHARED_ENVS[key] = [env, 1]
    return env


def _release(path: str) -> None:
    key = _env_key(path)
    entry = _SHARED_ENVS.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        del _SHARED_ENVS[key]
        entry[0].close()


def _resolve_files(path: Union[str, os.PathLike]) -> List[str]:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataFileError(f"{path}: no such file or folder (expected an OC20 .lmdb file or a folder of them)")
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.lmdb")))
        if not files:
            hint = ""
            if os.path.isfile(os.path.join(path, "data.mdb")):
                hint = f"; it holds data.mdb (an LMDB environment folder): pass the file {os.path.join(path, 'data.mdb')}"
            raise DataFileError(f"{path}: folder contains no *.lmdb files{hint}")
        return files
    return [path]


class LmdbDataset(Dataset):
    """OC20 S2EF folders / IS2RE files (fairchem's or ours) as canonical samples.

    Args:
        path: a ``.lmdb`` file or a folder of them (sorted by name).
        key_map: ``{sample_field: key or [keys]}`` overriding
            :data:`DEFAULT_KEY_MAP` (e.g. ``{"energy": "y_init"}``).
        trusted: unpickle with plain ``pickle`` (only for files you trust);
            by default an allow-list is enforced.
        extra_fields: record keys to keep as extra sample fields
            (e.g. ``("pos_relaxed", "y_init")``).
        transform: optional callable applied to each sample.
        count_entries: for files without a ``length`` key, count the numeric
            keys instead of raising.
        check_finite: raise :class:`~est.data.sample.NonFiniteInputError` (naming
            the file and key) for NaN/inf positions or cells; ``False`` passes them
            on for a consumer that checks batches itself (the trainer skips them
            under ``trainer.max_bad_batches``).
    """

    def __init__(
        self,
        path: Union[str, os.PathLike],
        *,
        key_map: Optional[Mapping[str, Union[str, Sequence[str]]]] = None,
        trusted: bool = False,
        extra_fields: Sequence[str] = (),
        transform=None,
        count_entries: bool = False,
        check_finite: bool = True,
    ):
        self.path = os.fspath(path)
        self.check_finite = check_finite
        self.files = _resolve_files(self.path)
        self.key_map = _merge_key_map(key_map)
        self.trusted = trusted
        self.extra_fields = tuple(extra_fields)
        self.transform = transform
        self._envs: Dict[int, lmdb.Environment] = {}
        self._pid = os.getpid()
        lengths, natoms, self._ours = [], [], []
        for i, f in enumerate(self.files):
            env = self._env(i)
            with env.begin() as txn:
                raw = txn.get(LENGTH_KEY)
                meta = txn.get(META_KEY)
                nat = txn.get(NATOMS_KEY)
            self._ours.append(meta is not None)
            if raw is None:
                if not count_entries:
                    raise DataFileError(
                        f"{f}: missing key b'length' (every OC20 LMDB file stores its sample count there); "
                        "the file is incomplete or not an OC20 LMDB. Pass count_entries=True to count the keys instead."
                    )
                n = self._count_numeric_keys(env)
            else:
                n = self._parse_length(raw, f)
            lengths.append(n)
            natoms.append(self._parse_natoms(nat, f, n) if nat is not None else None)
        self.lengths = lengths
        self._offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        if all(a is not None for a in natoms):
            self._natoms = np.concatenate(natoms) if natoms else np.zeros(0, np.int64)
        else:
            self._natoms = self._metadata_natoms()
        # environments are reopened lazily in each worker process
        self._close()

    # -- helpers
    def _parse_length(self, raw: bytes, f: str) -> int:
        try:
            if is_array_record(raw):
                value = decode_arrays(raw)["length"]
            elif raw.strip().isdigit():
                value = int(raw)
            else:
                value = safe_loads(raw, where=f"{f} key b'length'", trusted=self.trusted)
            return int(value)
        except (UnsafePickleError, DataFileError):
            raise
        except Exception as exc:
            raise CorruptRecordError(f"{f}: key b'length' is corrupt ({type(exc).__name__}: {exc})") from None

    def _parse_natoms(self, raw: bytes, f: str, n: int) -> np.ndarray:
        try:
            arr = decode_arrays(raw)["natoms"].astype(np.int64).reshape(-1)
        except Exception as exc:
            raise CorruptRecordError(f"{f}: key b'natoms' is corrupt ({type(exc).__name__}: {exc})") from None
        if arr.shape[0] != n:
            raise CorruptRecordError(f"{f}: key b'natoms' has {arr.shape[0]} entries but b'length' says {n}")
        return arr

    @staticmethod
    def _count_numeric_keys(env: lmdb.Environment) -> int:
        with env.begin() as txn:
            return sum(1 for k in txn.cursor().iternext(keys=True, values=False) if k.isdigit())

    def _metadata_natoms(self) -> Optional[np.ndarray]:
        folder = self.path if os.path.isdir(self.path) else os.path.dirname(self.path)
        meta = os.path.join(folder, "metadata.npz")
        if not os.path.isfile(meta):
            return None
        try:
            with np.load(meta, allow_pickle=False) as z:
                arr = np.asarray(z["natoms"]).astype(np.int64).reshape(-1)
        except Exception as exc:
            warnings.warn(f"{meta}: cannot read 'natoms' ({exc}); ignoring it")
            return None
        if arr.shape[0] != len(self):
            warnings.warn(f"{meta}: has {arr.shape[0]} atom counts but the data has {len(self)} samples; ignoring it")
            return None
        return arr

    def _env(self, i: int) -> lmdb.Environment:
        if self._pid != os.getpid():  # forked worker: never reuse the parent's handles
            self._envs = {}
            self._pid = os.getpid()
        env = self._envs.get(i)
        if env is None:
            env = _open_readonly(self.files[i])
            self._envs[i] = env
        return env

    def _close(self) -> None:
        if self._pid == os.getpid():
            for i in self._envs:
                _release(self.files[i])
        self._envs = {}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_envs"] = {}
        return state

    def __del__(self):
        try:
            self._close()
        except Exception:
            pass

    # -- public
    def __len__(self) -> int:
        return int(self._offsets[-1])

    @property
    def natoms(self) -> Optional[np.ndarray]:
        """Per-sample atom counts from the files (ours) or ``metadata.npz``; None if neither has them."""
        return self._natoms

    def locate(self, index: int):
        """``(file, key)`` of global sample ``index``."""
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples in {self.path}")
        i = bisect.bisect_right(self._offsets, index) - 1
        return i, str(index - int(self._offsets[i])).encode()

    def get_record(self, index: int) -> Dict[str, Any]:
        """The raw decoded record (a dict of fields) of sample ``index``."""
        i, key = self.locate(index)
        f = self.files[i]
        with self._env(i).begin() as txn:
            raw = txn.get(key)
        where = f"{f} key {key!r}"
        if raw is None:
            raise CorruptRecordError(f"{where}: key is missing although b'length' says {self.lengths[i]} samples")
        try:
            if is_array_record(raw):
                return decode_arrays(raw)
            obj = safe_loads(bytes(raw), where=where, trusted=self.trusted)
        except UnsafePickleError:
            raise
        except RecordFormatError as exc:
            raise CorruptRecordError(f"{where}: corrupt array record ({exc})") from None
        except Exception as exc:
            raise CorruptRecordError(
                f"{where}: cannot decode record ({type(exc).__name__}: {exc}); the file is truncated or corrupt"
            ) from None
        record = pyg_to_dict(obj)
        if record is None:
            raise CorruptRecordError(f"{where}: record is a {type(obj).__name__}, not a PyG Data or dict")
        return record

    def __getitem__(self, index: int):
        index = int(index)
        record = self.get_record(index)
        i, key = self.locate(index)
        sample = record_to_sample(
            record, index=index if index >= 0 else index + len(self), key_map=self.key_map,
            extra_fields=self.extra_fields, where=f"{self.files[i]} key {key!r}", check_finite=self.check_finite,
        )
        return self.transform(sample) if self.transform is not None else sample

    def __repr__(self) -> str:
        return f"LmdbDataset({self.path!r}, files={len(self.files)}, samples={len(self)})"


# --------------------------------------------------------------------------- writing


def _sample_fields(sample: Any) -> Dict[str, Any]:
    if isinstance(sample, Mapping):
        return dict(sample)
    if hasattr(sample, "items"):  # PyG Data
        return {k: v for k, v in sample.items()}
    raise TypeError(f"cannot write a {type(sample).__name__}; pass a PyG Data or a dict of arrays")


def _natoms_of(fields: Mapping[str, Any]) -> int:
    if "natoms" in fields and fields["natoms"] is not None:
        return int(np.asarray(fields["natoms"].cpu() if isinstance(fields["natoms"], torch.Tensor) else fields["natoms"]).reshape(-1)[0])
    pos = fields.get("pos")
    if pos is None:
        raise ValueError("sample has neither 'natoms' nor 'pos'")
    return int(pos.shape[0])


def _check_writable(fields: Mapping[str, Any], *, index: int, path: str) -> None:
    """Refuse a sample the reader could not turn back into a sample (no pos/Z, NaN input, bad shapes)."""
    where = f"{path}: sample {index} (to write)"
    for required in ("pos", "atomic_numbers"):
        if all(fields.get(k) is None for k in DEFAULT_KEY_MAP[required]):
            raise ValueError(f"{where} has no {required!r} (fields: {sorted(fields)}); every OC20 record needs "
                             f"pos and atomic_numbers. Fix: add {required!r} to the sample")
    record_to_sample(fields, index=index, where=where)


class LmdbWriter:
    """Stream samples into an OC20-layout LMDB file or folder (see module docstring).

    ``path`` ending in ``.lmdb`` -> one file; otherwise a folder of
    ``data.NNNN.lmdb`` shards of ``samples_per_shard`` samples each plus
    ``metadata.npz``. Everything is written under a temporary name and moved in
    place by :meth:`close`, so an interrupted write leaves no half database.
    :meth:`add` refuses (``ValueError``, nothing written) a sample without
    ``pos``/``atomic_numbers``, with NaN/inf positions or cell
    (:class:`~est.data.sample.NonFiniteInputError`) or mismatched shapes.
    An existing ``path`` is refused unless ``overwrite=True``.
    Use as a context manager; :meth:`add` returns the sample's global index.
    """

    def __init__(
        self,
        path: Union[str, os.PathLike],
        *,
        overwrite: bool = False,
        samples_per_shard: int = 10_000,
        map_size: int = 1 << 34,
    ):
        self.path = os.path.abspath(os.fspath(path))
        self.single = self.path.endswith(".lmdb")
        if os.path.exists(self.path) and not overwrite:
            raise FileExistsError(f"{self.path} already exists; pass overwrite=True to replace it")
        if samples_per_shard < 1:
            raise ValueError("samples_per_shard must be >= 1")
        self.overwrite = overwrite
        self.samples_per_shard = samples_per_shard
        self.map_size = map_size
        parent = os.path.dirname(self.path)
        os.makedirs(parent, exist_ok=True)
        self.tmp = os.path.join(parent, f".{os.path.basename(self.path)}.tmp-{os.getpid()}")
        if os.path.exists(self.tmp):
            shutil.rmtree(self.tmp) if os.path.isdir(self.tmp) else os.remove(self.tmp)
        if not self.single:
            os.makedirs(self.tmp)
        self._env: Optional[lmdb.Environment] = None
        self._shard = -1
        self._in_shard = 0
        self._shard_natoms: List[int] = []
        self.natoms: List[int] = []
        self._closed = False
        self._buffer: List[tuple] = []

    def _shard_path(self, shard: int) -> str:
        return self.tmp if self.single else os.path.join(self.tmp, f"data.{shard:04d}.lmdb")

    def _open_shard(self) -> None:
        self._shard += 1
        self._in_shard = 0
        self._shard_natoms = []
        self._env = lmdb.open(self._shard_path(self._shard), subdir=False, map_size=self.map_size,
                              readahead=False, meminit=False, map_async=True, lock=True)

    def _put(self, key: bytes, value: bytes) -> None:
        self._buffer.append((key, value))
        if len(self._buffer) >= 1000:
            self._commit()

    def _commit(self) -> None:
        while self._buffer:
            try:
                with self._env.begin(write=True) as txn:
                    for key, value in self._buffer:
                        txn.put(key, value)
                self._buffer = []
            except lmdb.MapFullError:
                self._env.set_mapsize(self._env.info()["map_size"] * 2)

    def _finish_shard(self) -> None:
        if self._env is None:
            return
        meta = json.dumps({"format": "est-lmdb", "version": 1}).encode()
        self._put(LENGTH_KEY, pickle.dumps(self._in_shard, protocol=4))
        self._put(NATOMS_KEY, encode_arrays({"natoms": np.asarray(self._shard_natoms, dtype=np.int32)}))
        self._put(META_KEY, meta)
        self._commit()
        self._env.sync()
        self._env.close()
        self._env = None
        lock = self._shard_path(self._shard) + "-lock"
        if os.path.exists(lock):
            os.remove(lock)

    def add(self, sample: Any) -> int:
        """Append one sample (PyG ``Data`` or dict of arrays/numbers/strings)."""
        if self._closed:
            raise RuntimeError("writer is closed")
        fields = _sample_fields(sample)
        _check_writable(fields, index=len(self.natoms), path=self.path)
        n = _natoms_of(fields)
        fields.setdefault("natoms", np.asarray([n], dtype=np.int64))
        if self._env is None or (not self.single and self._in_shard >= self.samples_per_shard):
            self._finish_shard()
            self._open_shard()
        self._put(str(self._in_shard).encode(), encode_arrays(fields))
        self._in_shard += 1
        self._shard_natoms.append(n)
        self.natoms.append(n)
        return len(self.natoms) - 1

    def close(self) -> None:
        """Finish the last file and move the database into place."""
        if self._closed:
            return
        if self._env is None:
            self._open_shard()  # an empty database still gets a valid file
        self._finish_shard()
        if not self.single:
            np.savez(os.path.join(self.tmp, "metadata.npz"), natoms=np.asarray(self.natoms, dtype=np.int64))
        if os.path.exists(self.path):
            if not self.overwrite:
                self.abort()
                raise FileExistsError(f"{self.path} appeared while writing; pass overwrite=True to replace it")
            shutil.rmtree(self.path) if os.path.isdir(self.path) else os.remove(self.path)
        os.replace(self.tmp, self.path)
        self._closed = True

    def abort(self) -> None:
        """Drop everything written so far."""
        self._buffer = []
        if self._env is not None:
            self._env.close()
            self._env = None
        for p in (self.tmp, self.tmp + "-lock"):
            if os.path.isdir(p):
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.exists(p):
                os.remove(p)
        self._closed = True

    def __len__(self) -> int:
        return len(self.natoms)

    def __enter__(self) -> "LmdbWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_lmdb(
    path: Union[str, os.PathLike],
    samples: Iterable[Any],
    *,
    overwrite: bool = False,
    samples_per_shard: int = 10_000,
    map_size: int = 1 << 34,
) -> int:
    """Write ``samples`` (PyG ``Data`` or dicts) to ``path``; returns the count.

    ``path`` ending in ``.lmdb`` is one file (IS2RE layout), anything else a
    folder of ``data.NNNN.lmdb`` shards plus ``metadata.npz`` (S2EF layout).
    Values are code-free array records; ``natoms`` per sample is stored for
    balanced batching. Raises ``FileExistsError`` if ``path`` exists, unless
    ``overwrite=True``.
    """
    with LmdbWriter(path, overwrite=overwrite, samples_per_shard=samples_per_shard, map_size=map_size) as w:
        for s in samples:
            w.add(s)
        n = len(w)
    return n
