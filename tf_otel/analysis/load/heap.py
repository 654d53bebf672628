"""The decoding process's heap: glibc's allocator kept from giving block buffers back to the
system between blocks.

Usage::

    hold_block_buffers()   # once in a process that decodes trace files (idempotent)

Each block of a trace file (8 MiB read, its spans decoded and marshalled: several buffers of
megabytes) is freed before the next is made. glibc's mmap threshold moves with what it sees
freed, and in some runs the block buffers were served from fresh mappings or trimmed heap
every block, each page faulted in anew: the load stage then took ~0.4 s more CPU at 100 steps
× 64 ranks, all of it system time (docs/benchmarks/analysis.md). Holding the thresholds above
a block's buffers serves them from the heap every time; the peak is the same. Only the
analysis (``tf-otel analyze``) calls it, never the training process; a threshold set in the
environment (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``GLIBC_TUNABLES``) is
left as set, and an allocator without ``mallopt`` is left alone.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest; a block's buffers are a few MiB
TRIM_THRESHOLD = 64 << 20
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

_held: bool = False


def hold_block_buffers() -> bool:
    """Hold glibc's mmap and trim thresholds above a block's buffers in this process; whether
    they are held (False: not glibc on Linux, or set in the environment)."""
    global _held
    if _held:
        return True
    if not sys.platform.startswith("linux") or any(name in os.environ for name in _ENV):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    if not hasattr(libc, "gnu_get_libc_version"):
        return False  # glibc only: another allocator's mallopt means other things
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _held = bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    return _held
