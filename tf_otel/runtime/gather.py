"""Gather to rank 0, reduce, broadcast: the exchange sources run over the coordinator link.

Usage::

    rounds = Gather(world=lambda: pipeline.topology.world_size, reduce=answer, wait_s=5.0,
                    max_rounds=64, dropped="horovod_stamp_gathers_dropped")
    to_reference(pipeline, part_message, on_part)        # any rank: rank 0 handles its own
    def on_part(rank, message): rounds.add((key, step), rank, message["a"])   # rank 0
    def answer(round_id, parts): to_every_rank(pipeline, reply, on_reply)     # rank 0
    rounds.flush()                                       # rank 0 at exit: what is still open

A round is answered once every rank's part is in, or (with the ranks it has) when a part of any
round arrives ``wait_s`` after the round's first; ``reduce`` runs outside the lock, on the thread
that completed the round. At most ``max_rounds`` rounds are open: the oldest is dropped, counted.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, Generic, Hashable, List, Tuple, TypeVar

from tf_otel.cluster.messages import Message, Outgoing
from tf_otel.health import count
from tf_otel.runtime.steps import Pipeline

R = TypeVar("R", bound=Hashable)  # what names a round, e.g. (step key, step)
P = TypeVar("P")  # one rank's part


class Gather(Generic[R, P]):
    """Rank 0's open rounds: one part per rank each."""

    def __init__(
        self,
        world: Callable[[], int],
        reduce: Callable[[R, Dict[int, P]], None],
        wait_s: float,
        max_rounds: int,
        dropped: str,
    ) -> None:
        self.world = world  # ranks expected per round (read per part: identity may be adopted)
        self.reduce = reduce
        self.wait_s = wait_s
        self.max_rounds = max_rounds
        self.dropped = dropped  # the health counter of rounds dropped unanswered
        self._lock = threading.Lock()
        # round -> (monotonic time of its first part, parts by rank)
        self._open: OrderedDict[R, Tuple[float, Dict[int, P]]] = OrderedDict()

    def add(self, round_id: R, rank: int, part: P) -> None:
        """One rank's part of a round; answers the rounds that are complete or overdue."""
        world = self.world()
        ready: List[Tuple[R, Dict[int, P]]] = []
        with self._lock:
            entry = self._open.get(round_id)
            if entry is None:
                entry = self._open[round_id] = (time.monotonic(), {})
            entry[1][rank] = part
            now = time.monotonic()
            for key, (since, parts) in list(self._open.items()):
                if len(parts) >= world or now - since > self.wait_s:
                    del self._open[key]
                    ready.append((key, parts))
            while len(self._open) > self.max_rounds:
                self._open.popitem(last=False)
                count(self.dropped)
        for key, parts in ready:
            self.reduce(key, parts)

    def flush(self) -> List[R]:
        """Answer every open round with the parts it has (rank 0 at exit); the rounds."""
        with self._lock:
            pending = list(self._open.items())
            self._open.clear()
        for key, (_, parts) in pending:
            self.reduce(key, parts)
        return [key for key, _ in pending]


def to_reference(
    pipeline: Pipeline, message: Outgoing, on_reference: Callable[[int, Any], None]
) -> None:
    """A rank's message for rank 0: sent over the link, or handled here on rank 0 itself."""
    if pipeline.topology.is_reference:
        on_reference(pipeline.topology.rank, message)
    else:
        pipeline.send_to_reference(message)


def to_every_rank(pipeline: Pipeline, message: Outgoing, on_rank: Callable[[Message], None]) -> int:
    """Rank 0's answer to every rank: broadcast, and handled here on rank 0 too; the number of
    ranks it was sent to."""
    sent = pipeline.broadcast(message)
    on_rank(dict(message))
    return sent
