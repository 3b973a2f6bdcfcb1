"""Where processed data goes, and writing it atomically.

The cache folder is, in order: the ``cache_dir`` argument, ``$EST_CACHE_DIR``,
``$XDG_CACHE_HOME/est``, ``~/.cache/est``. Processed files are never written
into a user's source folder.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any, Dict, Optional

import numpy as np

__all__ = ["default_cache_dir", "cache_key", "atomic_savez", "atomic_json", "is_inside"]


def default_cache_dir(cache_dir: Optional[str] = None) -> str:
    if cache_dir:
        return os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
    env = os.environ.get("EST_CACHE_DIR")
    if env:
        return os.path.abspath(os.path.expanduser(env))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "est")


def cache_key(payload: Dict[str, Any]) -> str:
    """Stable short hash of a JSON-able description (source files, options, version)."""
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def file_signature(path: str) -> Dict[str, Any]:
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def is_inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    try:
        return os.path.commonpath([path, folder]) == folder
    except ValueError:
        return False


def atomic_savez(path: str, **arrays: np.ndarray) -> None:
    """``np.savez`` to ``path`` via a temporary file in the same folder + ``os.replace``."""
    _atomic_write(path, ".npz", lambda fh: np.savez(fh, **arrays))


def atomic_json(path: str, obj: Any) -> None:
    """``json.dump(obj)`` (indented) to ``path`` via a temporary file in the same folder + ``os.replace``."""
    atomic_text(path, json.dumps(obj, indent=1))


def atomic_text(path: str | os.PathLike, text: str) -> None:
    """``text`` (UTF-8) to ``path`` via a temporary file in the same folder + ``os.replace`` (the folder is made
    if missing): a reader (another process merging into the same file) never sees half a file, and a failed
    write leaves the old file and no temporary one."""
    _atomic_write(os.fspath(path), os.path.splitext(path)[1], lambda fh: fh.write(text.encode()))


def _atomic_write(path: str, suffix: str, write) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; a cache is shared like any file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
