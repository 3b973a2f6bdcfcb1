"""Writing OC20-layout LMDB files and folders: :class:`LmdbWriter`, :func:`write_lmdb`.

See :mod:`est.data.lmdb_io` for the layout. Each value is a code-free array
record (:mod:`est.data.arrays`); a sample the reader could not turn back into
a sample is refused before anything is written, and the database appears
under its name only when complete.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

import lmdb
import numpy as np
import torch

from .arrays import encode_arrays
from .lmdb_records import DEFAULT_KEY_MAP, LENGTH_KEY, META_KEY, NATOMS_KEY, record_to_sample

__all__ = ["LmdbWriter", "write_lmdb"]


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
