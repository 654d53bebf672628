"""glibc's malloc held to a fixed mmap threshold while trace files are read in big blocks.

Usage::

    fixed_mmap_threshold()   # once per process before the blocks are read; False: not glibc

glibc serves an allocation above its mmap threshold (128 KiB at start) with its own mapping,
returned to the system when freed; but each such free raises the threshold to the freed size,
so after the first 8 MiB block every block, buffer and decoded piece comes from the heap, which
then grows and fragments step after step. Measured on the bench's 64-rank traces
(docs/BENCHMARKS_analysis.md): the analysis' peak grew 1.15-1.3x from 100 to 400 steps with
the threshold moving and 1.03x with it fixed. Setting the threshold (``mallopt``) is what
glibc documents for this; it turns the adjustment off and changes nothing else. Not glibc (musl,
macOS): nothing is done.
"""

from __future__ import annotations

import ctypes

_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
THRESHOLD = 128 * 1024  # glibc's own starting value
_state = {"fixed": False}


def fixed_mmap_threshold() -> bool:
    """Hold the mmap threshold at ``THRESHOLD`` (once); whether it is held."""
    if _state["fixed"]:
        return True
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process' own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _state["fixed"] = mallopt(_M_MMAP_THRESHOLD, THRESHOLD) == 1
    return _state["fixed"]
