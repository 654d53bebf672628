"""Ranks agree on the first step that runs a detail twin (instrument/detail_twin.py).

Every rank prepares its twins (and TF1 runs) on its own thread and reports the generations it
has prepared to rank 0 (``tf_otel.twin.ready``, from the twin thread, again until answered).
Once every rank that steps has reported a generation, rank 0 answers every rank
(``tf_otel.twin.open``) with it and, for each step key it has stepped, a first step ``MARGIN``
steps past its last one:
ranks whose steps are held together by collectives are at most a step apart, so each has the
answer before that step begins and every rank details the same steps. A rank that gets the
answer after that step (never expected) counts it and logs once.

Usage::

    with_pipeline(detail_twin_gate.attach)     # the stamps source, once per process
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List, Set

from tf_otel.cluster import messages
from tf_otel.health import count, log_once
from tf_otel.instrument import detail_twin
from tf_otel.runtime.gather import to_every_rank, to_reference
from tf_otel.runtime.steps import Pipeline

MARGIN = 3  # rank 0's first twin step of a key: its last step + MARGIN


class _Reference:
    """Rank 0: each rank's prepared generations; the generations opened, with the first steps
    each was opened from (a lost answer is sent again with the same steps)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.lock = threading.Lock()
        self.ready: Dict[int, Set[int]] = {}
        self.opened: Dict[int, Dict[str, int]] = {}

    def on_ready(self, rank: int, message: Dict[str, Any]) -> None:
        world = max(1, int(self.pipeline.topology.step_world_size))
        prepared = {int(g) for g in message.get("p") or ()}
        with self.lock:
            if 0 <= rank < world:
                self.ready.setdefault(rank, set()).update(prepared)
            if len(self.ready) < world:
                return
            common = set.intersection(*self.ready.values())
            new = sorted(common - self.opened.keys())
            if not new:
                again = sorted(prepared & self.opened.keys())  # a rank asked again: lost
                resend = [(g, self.opened[g]) for g in again]
            else:
                starts = {key: step + MARGIN for key, step in detail_twin.last_steps().items()}
                for generation in new:
                    self.opened[generation] = starts
        if not new:
            for generation, starts in resend:
                self._send(rank, [generation], starts)
            return
        to_every_rank(self.pipeline, messages.twin_open(new, starts), on_open)
        log_once(
            "twin_open",
            "tf_otel: detail twins prepared on every rank; detail from %s",
            starts,
            level=logging.INFO,
        )

    def _send(self, rank: int, generations: List[int], starts: Dict[str, int]) -> None:
        if rank == self.pipeline.topology.rank:
            on_open(dict(messages.twin_open(generations, starts)))
        else:
            self.pipeline.send_to_rank(rank, messages.twin_open(generations, starts))


def on_open(message: Dict[str, Any]) -> None:
    """A rank: rank 0 opened generations of detail preparations."""
    starts = {str(k): int(v) for k, v in dict(message.get("w") or {}).items()}
    last = detail_twin.last_steps()
    late = [key for key, start in starts.items() if last.get(key, -1) >= start]
    if late:
        count("twin_open_late")
        log_once(
            "twin_open_late",
            "tf_otel: detail twins opened after the agreed first step here for %s; this rank "
            "details from its next picked step",
            late[:3],
        )
        starts.update({key: last[key] + 1 for key in late})
    detail_twin.open([int(g) for g in message.get("p") or ()], starts)


def attach(pipeline: Pipeline) -> None:
    """Handlers on this pipeline, and the twin thread's report to rank 0 through it."""
    if pipeline.topology.is_reference:
        reference = _Reference(pipeline)
        pipeline.handlers.on_reference(messages.TWIN_READY, reference.on_ready)

        def report(generations: List[int]) -> None:
            reference.on_ready(pipeline.topology.rank, dict(messages.twin_ready(generations)))

    else:
        pipeline.handlers.on_rank(messages.TWIN_OPEN, on_open)

        def report(generations: List[int]) -> None:
            to_reference(pipeline, messages.twin_ready(generations), lambda r, m: None)

    detail_twin.reported_by(report)
