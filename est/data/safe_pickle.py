"""Restricted unpickling for OC20-style LMDB records.

``pickle.loads`` runs whatever code a file names, so records from files we did
not write are loaded with :class:`RestrictedUnpickler`, which resolves only an
allow-list of globals: PyG ``Data`` and its storage classes, tensors, numpy
arrays and dtypes, and a few builtins. Tensor storages inside PyG pickles are
serialised by torch as a nested ``torch.save`` blob loaded through
``torch.storage._load_from_bytes`` (which calls ``torch.load(weights_only=False)``);
we substitute a loader that uses ``torch.load(weights_only=True)``.

Anything else raises :class:`UnsafePickleError`, which names the class and the
opt-out (``trusted=True``) for files from a source you trust.
"""
from __future__ import annotations

import io
import pickle
import struct
from typing import Any, Optional

import torch

__all__ = ["UnsafePickleError", "RestrictedUnpickler", "safe_loads", "ALLOWED_GLOBALS"]


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle names a global that is not on the allow-list."""


_STORAGE_DTYPES = {
    "FloatStorage": torch.float32, "DoubleStorage": torch.float64, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8, "BoolStorage": torch.bool,
}


class _StorageHeaderUnpickler(pickle.Unpickler):
    """Reads the pickles of a legacy ``torch.save`` blob of one storage; resolves nothing but storage types."""

    def find_class(self, module: str, name: str):
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        raise pickle.UnpicklingError(f"unexpected global {module}.{name} in a storage blob")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and isinstance(pid[1], torch.dtype)):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        return ("storage", pid[1], str(pid[2]), int(pid[4]))


def _fast_storage(b: bytes):
    """Parse the legacy ``torch.save`` format of a single storage directly (no code, no torch.load).

    Layout: pickled magic number, protocol version, sys info; the pickled
    object (a persistent id ``("storage", StorageType, key, location, numel,
    ...)``); the pickled list of keys; then per key an int64 element count and
    the raw little-endian bytes. Returns None when the blob is anything else.
    """
    f = io.BytesIO(b)
    for _ in range(2):
        _StorageHeaderUnpickler(f).load()
    sysinfo = _StorageHeaderUnpickler(f).load()
    if not (isinstance(sysinfo, dict) and sysinfo.get("little_endian", False)):
        return None
    obj = _StorageHeaderUnpickler(f).load()
    keys = _StorageHeaderUnpickler(f).load()
    if not (isinstance(obj, tuple) and obj[0] == "storage" and keys == [obj[2]]):
        return None
    dtype, numel = obj[1], obj[3]
    (count,) = struct.unpack("<q", f.read(8))
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = f.read(count * itemsize)
    if count != numel or len(raw) != count * itemsize:
        raise pickle.UnpicklingError(f"storage blob truncated: {len(raw)} of {count * itemsize} bytes")
    if count == 0:
        t = torch.empty(0, dtype=dtype)
    else:
        t = torch.frombuffer(bytearray(raw), dtype=dtype)
    return torch.storage.TypedStorage(wrap_storage=t.untyped_storage(), dtype=dtype, _internal=True)


def _safe_load_from_bytes(b: bytes) -> Any:
    """Replacement for ``torch.storage._load_from_bytes``: storages only, never code."""
    try:
        out = _fast_storage(b)
    except (pickle.UnpicklingError, EOFError, struct.error, ValueError, TypeError, IndexError):
        out = None
    if out is None:  # another layout: torch's own loader, restricted to tensors
        try:
            out = torch.load(io.BytesIO(b), weights_only=True)
        except pickle.UnpicklingError as exc:
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise UnsafePickleError(
                "refusing to load a tensor-storage blob that holds more than tensors (torch says: "
                f"{first}); unpickling it could run arbitrary code. If you trust the file's source, "
                "open it with trusted=True."
            ) from None
    return out


_TORCH_DTYPES = {
    name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)
}

ALLOWED_GLOBALS = {
    # PyG 1.x and 2.x data classes
    ("torch_geometric.data.data", "Data"),
    ("torch_geometric.data.data", "DataEdgeAttr"),
    ("torch_geometric.data.data", "DataTensorAttr"),
    ("torch_geometric.data.storage", "GlobalStorage"),
    ("torch_geometric.data.storage", "BaseStorage"),
    ("torch_geometric.data.storage", "NodeStorage"),
    ("torch_geometric.data.storage", "EdgeStorage"),
    ("torch_geometric.data.view", "KeysView"),
    # tensors
    ("torch._utils", "_rebuild_tensor"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._tensor", "_rebuild_from_type_v2"),
    ("torch", "Tensor"),
    ("torch", "Size"),
    ("torch", "device"),
    ("torch.nn.parameter", "Parameter"),
    # numpy arrays and scalars (numpy 1.x and 2.x module names)
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    # builtins
    ("builtins", "object"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("builtins", "complex"),
    ("builtins", "range"),
    ("builtins", "bytearray"),
    ("__builtin__", "set"),
    ("__builtin__", "object"),
    ("collections", "OrderedDict"),
    ("_codecs", "encode"),  # protocol-2 pickles encode bytes as _codecs.encode(str, "latin1")
    ("copy_reg", "_reconstructor"),
    ("copyreg", "_reconstructor"),
}


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only :data:`ALLOWED_GLOBALS`.

    ``where`` (e.g. ``"data.0000.lmdb key b'12'"``) is put in error messages.
    """

    def __init__(self, file, *, where: str = "", **kwargs):
        super().__init__(file, **kwargs)
        self.where = where

    def load(self):
        try:
            return super().load()
        except UnsafePickleError as exc:
            if self.where and self.where not in str(exc):
                raise UnsafePickleError(f"{self.where}: {exc}") from None
            raise

    def find_class(self, module: str, name: str):
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return _safe_load_from_bytes
        if module == "torch" and name in _TORCH_DTYPES:
            return getattr(torch, name)
        if module.startswith("numpy.dtypes") and name.endswith("DType"):
            return super().find_class(module, name)
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        where = f" in {self.where}" if self.where else ""
        raise UnsafePickleError(
            f"refusing to unpickle {module}.{name}{where}: it is not on the allow-list of "
            "safe classes (tensors, numpy arrays, PyG Data, builtins), and unpickling "
            "other classes can run arbitrary code. If you trust the file's source, open "
            "it with trusted=True (e.g. LmdbDataset(path, trusted=True))."
        )


def safe_loads(data: bytes, *, where: str = "", trusted: bool = False) -> Any:
    """Unpickle ``data`` with the allow-list (or plain ``pickle`` when ``trusted``)."""
    if trusted:
        return pickle.loads(data)
    return RestrictedUnpickler(io.BytesIO(data), where=where).load()


def pyg_to_dict(obj: Any) -> Optional[dict]:
    """Fields of an unpickled PyG 1.x or 2.x ``Data`` (or a plain dict) as a dict.

    PyG 1.x objects unpickled under PyG 2.x keep their attributes in
    ``__dict__`` with no ``_store``; PyG 2.x objects keep them in ``_store``.
    Returns None for anything else.
    """
    if isinstance(obj, dict):
        return dict(obj)
    state = getattr(obj, "__dict__", None)
    if state is None:
        return None
    store = state.get("_store")
    if store is not None:
        try:
            return {k: v for k, v in store.items()}
        except Exception:  # pragma: no cover - unusual storage
            pass
    return {k: v for k, v in state.items() if not k.startswith("_") or k == "__num_nodes__"}
