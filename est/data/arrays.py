"""A code-free binary record of named numpy arrays (what :func:`write_lmdb` stores).

Layout: ``b"ESTA"`` + version byte + little-endian uint32 header length +
UTF-8 JSON header ``{"arrays": [[name, dtype, shape, offset, nbytes], ...],
"strings": {name: text}}`` + the raw array bytes. Decoding only calls
``np.frombuffer``: no pickle, no code.
"""
from __future__ import annotations

import json
import struct
from typing import Any, Dict, Mapping

import numpy as np
import torch

__all__ = ["MAGIC", "encode_arrays", "decode_arrays", "is_array_record", "RecordFormatError"]

MAGIC = b"ESTA"
VERSION = 1
_ALLOWED_KINDS = set("biufc")  # bool, int, uint, float, complex


class RecordFormatError(ValueError):
    """An array record is truncated or malformed."""


def _to_numpy(name: str, value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.dtype.kind not in _ALLOWED_KINDS:
        raise TypeError(
            f"field {name!r} has dtype {arr.dtype}; array records hold numbers and booleans only "
            "(strings go in as str values)"
        )
    return np.ascontiguousarray(arr)


def encode_arrays(fields: Mapping[str, Any]) -> bytes:
    """Serialise ``{name: tensor | ndarray | number | str}`` (None values are skipped)."""
    header: Dict[str, Any] = {"arrays": [], "strings": {}}
    chunks = []
    offset = 0
    for name, value in fields.items():
        if value is None:
            continue
        if isinstance(value, str):
            header["strings"][name] = value
            continue
        arr = _to_numpy(name, value)
        raw = arr.tobytes()
        header["arrays"].append([name, arr.dtype.newbyteorder("<").str if arr.dtype.byteorder == ">" else arr.dtype.str,
                                 list(arr.shape), offset, len(raw)])
        if arr.dtype.byteorder == ">":
            raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        chunks.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return MAGIC + bytes([VERSION]) + struct.pack("<I", len(head)) + head + b"".join(chunks)


def is_array_record(buf: bytes) -> bool:
    return bytes(buf[:4]) == MAGIC


def decode_arrays(buf: bytes) -> Dict[str, Any]:
    """Inverse of :func:`encode_arrays`: ``{name: np.ndarray (writable copy) | str}``."""
    buf = bytes(buf)
    if len(buf) < 9 or buf[:4] != MAGIC:
        raise RecordFormatError("not an array record (bad magic or shorter than its header)")
    if buf[4] != VERSION:
        raise RecordFormatError(f"array record version {buf[4]} is newer than this reader ({VERSION})")
    (hlen,) = struct.unpack("<I", buf[5:9])
    if 9 + hlen > len(buf):
        raise RecordFormatError(f"header says {hlen} bytes but only {len(buf) - 9} follow")
    try:
        header = json.loads(buf[9 : 9 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordFormatError(f"unreadable header ({exc})") from None
    body = memoryview(buf)[9 + hlen :]
    out: Dict[str, Any] = {}
    for name, dtype, shape, offset, nbytes in header.get("arrays", []):
        dt = np.dtype(dtype)
        if dt.kind not in _ALLOWED_KINDS:
            raise RecordFormatError(f"field {name!r} has disallowed dtype {dtype}")
        if offset + nbytes > len(body):
            raise RecordFormatError(
                f"field {name!r} needs bytes {offset}..{offset + nbytes} but the record body has {len(body)}"
            )
        count = int(np.prod(shape)) if shape else 1
        if count * dt.itemsize != nbytes:
            raise RecordFormatError(f"field {name!r}: shape {shape} x {dt} does not match {nbytes} bytes")
        out[name] = np.frombuffer(body[offset : offset + nbytes], dtype=dt).reshape(shape).copy()
    out.update(header.get("strings", {}))
    return out
