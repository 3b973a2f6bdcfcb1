"""Reading OC20-layout LMDB files (fairchem's or ours) as canonical samples: :class:`LmdbDataset`.

See :mod:`est.data.lmdb_io` for the layout. Pickled records go through
:mod:`est.data.safe_pickle` unless ``trusted=True``; our array records
(:mod:`est.data.arrays`) are decoded without pickle.
"""
from __future__ import annotations

import bisect
import glob
import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import lmdb
import numpy as np
from torch.utils.data import Dataset

from .arrays import RecordFormatError, decode_arrays, is_array_record
from .lmdb_check import DataFileError
from .lmdb_envs import open_readonly, release_readonly
from .lmdb_records import LENGTH_KEY, META_KEY, NATOMS_KEY, CorruptRecordError, merge_key_map, record_to_sample
from .safe_pickle import UnsafePickleError, pyg_to_dict, safe_loads

__all__ = ["LmdbDataset"]


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
        self.key_map = merge_key_map(key_map)
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
            env = open_readonly(self.files[i])
            self._envs[i] = env
        return env

    def _close(self) -> None:
        if self._pid == os.getpid():
            for i in self._envs:
                release_readonly(self.files[i])
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
