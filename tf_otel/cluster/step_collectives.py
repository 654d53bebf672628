"""Which collectives each step holds, for a stall record: learned where the program builds them.

A rank stuck in a TensorFlow graph waits in Horovod's C++ queue, which Python cannot see. What
Python does see, at no cost while training: the collectives the program builds into each step
function (``note_built``, called by the Horovod op wrappers while the function is traced on the
training thread, i.e. inside its step) and the collectives it calls eagerly (``note_done`` after
each call returns). Rank 0's stall record then says which collectives the waiting ranks' step
holds and, where a rank has not begun the step, that none of them can have completed (each
needs every rank).

Usage::

    log = StepCollectives()
    log.note_built("tf_function:train_step", "allreduce", "DistributedGradientTape_Allreduce/x")
    log.note_done("allreduce", "loss_average")                  # an eager call that returned
    log.built("tf_function:train_step") -> (1, [["allreduce", "DistributedGradient..."]])
    log.last_done() -> ["allreduce", "loss_average", ns since]

Bounded: MAX_KEYS step keys, MAX_NAMES names a key (more are counted, not kept).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

from tf_otel import clock

MAX_KEYS = 64
MAX_NAMES = 256  # collectives kept per step key (a model's gradients: one per variable or bucket)
MAX_NAME_CHARS = 200
SHOWN = 8  # collectives a rank sends in its answer (the count says how many there are)


class StepCollectives:
    """The collectives built into each step key's graph (in build order), and the last eager
    collective that completed on this rank."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: OrderedDict[str, Dict[Tuple[str, str], None]] = OrderedDict()
        self._counts: Dict[str, int] = {}
        self._last: Optional[Tuple[str, str, int]] = None

    def note_built(self, key: str, op: str, name: str) -> None:
        """A collective ``op`` named ``name`` built into step ``key``'s graph (trace time)."""
        entry = (op, name[:MAX_NAME_CHARS])
        with self._lock:
            names = self._by_key.get(key)
            if names is None:
                names = self._by_key[key] = {}
                while len(self._by_key) > MAX_KEYS:
                    gone, _ = self._by_key.popitem(last=False)
                    self._counts.pop(gone, None)
            if entry in names:
                return  # a retrace, or the detail twin, builds the same collective again
            self._counts[key] = self._counts.get(key, 0) + 1
            if len(names) < MAX_NAMES:
                names[entry] = None

    def note_done(self, op: str, name: str) -> None:
        """An eager collective returned (one field store: called on every eager call)."""
        self._last = (op, name[:MAX_NAME_CHARS], clock.now_ns())

    def built(self, key: str, shown: int = SHOWN) -> Tuple[int, List[List[str]]]:
        """How many collectives ``key``'s graph holds, and the first ``shown`` as [op, name]."""
        with self._lock:
            names = list(self._by_key.get(key, ()))[:shown]
            return self._counts.get(key, 0), [[op, name] for op, name in names]

    def last_done(self) -> Optional[List[object]]:
        """[op, name, ns since it returned] of the last eager collective, or None."""
        last = self._last
        if last is None:
            return None
        return [last[0], last[1], max(0, clock.now_ns() - last[2])]
