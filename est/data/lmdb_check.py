"""LMDB file checks: whether a file is LMDB, and whether it is as long as its header says.

Reading past the end of a truncated LMDB file (an interrupted copy, a full
disk) would kill the process with SIGBUS, so every reader maps a file only
after :func:`check_lmdb_file` has compared its size with the size its header
says the data needs. Only the file's first two pages are read; nothing here
imports ``lmdb``.
"""
from __future__ import annotations

import os
import struct
from typing import Optional, Tuple

__all__ = ["DataFileError", "check_lmdb_file", "is_lmdb_file"]


class DataFileError(OSError):
    """A data file or folder is missing, empty, or not what it should be."""



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
