"""Ranks agree on the first step that runs a detail twin (instrument/detail_twin.py).

Every rank prepares its twins on its own thread and reports the generation it has prepared to
rank 0 (``tf_otel.twin.ready``, from the twin thread, again until answered). Once every rank
that steps has reported generation g or more, rank 0 answers every rank (``tf_otel.twin.open``)
with g and, for each step key it has stepped, a first step ``MARGIN`` steps past its last one:
ranks whose steps are held together by collectives are at most a step apart, so each has the
answer before that step begins and every rank details the same steps. A rank that gets the
answer after that step (never expected) counts it and logs once.

Usage::

    with_pipeline(detail_twin_gate.attach)     # the stamps source, once per process
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict

from tf_otel.cluster import messages
from tf_otel.health import count, log_once
from tf_otel.instrument import detail_twin
from tf_otel.runtime.gather import to_every_rank, to_reference
from tf_otel.runtime.steps import Pipeline

MARGIN = 3  # rank 0's first twin step of a key: its last step + MARGIN


class _Reference:
    """Rank 0: each rank's prepared generation; the last generation opened."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.lock = threading.Lock()
        self.ready: Dict[int, int] = {}
        self.opened = 0

    def on_ready(self, rank: int, message: Dict[str, Any]) -> None:
        world = max(1, int(self.pipeline.topology.step_world_size))
        with self.lock:
            if 0 <= rank < world:
                self.ready[rank] = max(self.ready.get(rank, 0), int(message["g"]))
            if len(self.ready) < world:
                return
            generation = min(self.ready.values())
            if generation <= self.opened:
                if generation == self.opened:  # a rank asked again: its answer was lost
                    self._send(rank, generation)
                return
            self.opened = generation
        starts = {key: step + MARGIN for key, step in detail_twin.last_steps().items()}
        to_every_rank(self.pipeline, messages.twin_open(generation, starts), on_open)
        log_once(
            "twin_open",
            "tf_otel: detail twins prepared on every rank; detail from %s",
            starts,
            level=logging.INFO,
        )

    def _send(self, rank: int, generation: int) -> None:
        starts = {key: step + MARGIN for key, step in detail_twin.last_steps().items()}
        if rank == self.pipeline.topology.rank:
            on_open(dict(messages.twin_open(generation, starts)))
        else:
            self.pipeline.send_to_rank(rank, messages.twin_open(generation, starts))


def on_open(message: Dict[str, Any]) -> None:
    """A rank: rank 0 opened a generation of twins."""
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
    detail_twin.open(int(message["g"]), starts)


def attach(pipeline: Pipeline) -> None:
    """Handlers on this pipeline, and the twin thread's report to rank 0 through it."""
    if pipeline.topology.is_reference:
        reference = _Reference(pipeline)
        pipeline.handlers.on_reference(messages.TWIN_READY, reference.on_ready)

        def report(generation: int) -> None:
            reference.on_ready(pipeline.topology.rank, dict(messages.twin_ready(generation)))

    else:
        pipeline.handlers.on_rank(messages.TWIN_OPEN, on_open)

        def report(generation: int) -> None:
            to_reference(pipeline, messages.twin_ready(generation), lambda r, m: None)

    detail_twin.reported_by(report)
