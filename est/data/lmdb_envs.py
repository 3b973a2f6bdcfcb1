"""Read-only LMDB environments shared within a process.

py-lmdb refuses to open one file twice in a process, so the readers share one
read-only environment per file (reference-counted, keyed by process, real path
and inode). A forked worker closes, in itself only, the environments its
parent opened before it opens its own. Each file is checked
(:func:`~est.data.lmdb_check.check_lmdb_file`) before it is first mapped, and
opened without a lock file: a reader never modifies or creates anything.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

import lmdb

from .lmdb_check import DataFileError, check_lmdb_file

__all__ = ["open_readonly", "release_readonly"]

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


def open_readonly(path: str) -> lmdb.Environment:
    """The shared read-only environment of LMDB file ``path`` (opened and checked on first use)."""
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


def release_readonly(path: str) -> None:
    """Drop one reference to ``path``'s environment; the last one closes it."""
    key = _env_key(path)
    entry = _SHARED_ENVS.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        del _SHARED_ENVS[key]
        entry[0].close()

