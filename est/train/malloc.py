"""Keep freed CPU memory in the process (glibc): large tensors stop paying page faults on every step.

PyTorch allocates CPU tensors with ``malloc``. glibc serves a request above
its mmap threshold (128 KiB, rising to at most 32 MiB on 64-bit) with a fresh ``mmap`` and
returns it to the kernel on ``free``, so a training step that creates the
same large temporaries every time (the message block's grid activation on
``[E, S, C]`` edge features with gradient forces: tens of MiB each) faults in
and zeroes every page of them again, every step. With ``mmap`` off and the
heap trimmed only above 2 GiB of free memory at its top, freed blocks are
reused instead, as PyTorch's CUDA caching allocator does on the GPU:

    mallopt(M_MMAP_MAX, 0)                # every allocation from the heap
    mallopt(M_TRIM_THRESHOLD, 2**31 - 1)  # the largest threshold mallopt takes

(the environment variables ``MALLOC_MMAP_MAX_=0`` and
``MALLOC_TRIM_THRESHOLD_`` do the same when set before Python starts). The
cost: the process keeps about its peak memory until it exits.
``benchmarks/bench_cpu_malloc.py`` measures the step time both ways;
``trainer.keep_freed_memory=true`` turns it on for a CPU run, and
``keep_freed_memory()`` in any process (it returns False, changing nothing,
where the C library is not glibc).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import platform

__all__ = ["keep_freed_memory"]

#: glibc's mallopt parameter numbers (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
#: the trim threshold set: the largest int mallopt takes (2 GiB)
TRIM_BYTES = 2**31 - 1


def _glibc():
    """glibc's handle, or None (another C library or OS)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Turn glibc's ``mmap`` for large blocks off and heap trimming off, for this whole process (module
    docstring). Idempotent. Returns whether both settings took (False where the C library is not glibc)."""
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_BYTES))
