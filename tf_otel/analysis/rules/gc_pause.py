"""``paused_gc()``: no cyclic garbage collection while millions of acyclic objects are made.

Usage::

    with paused_gc():
        spans = decode_everything()
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def paused_gc() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
