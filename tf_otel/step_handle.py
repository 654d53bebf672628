"""One step on this rank, as the training thread holds it from ``begin_step`` to ``end_step``.

Usage::

    handle = pipeline.begin_step(key, name, kind)   # tf_otel.runtime.steps
    handle.attributes["tf_otel.x"] = 1              # step hooks add to its span ...
    handle.deferred.append(lambda: records)         # ... and Records, built on the export thread
    pipeline.end_step(handle)

Step hooks (instrument/_patching.StepHook) share what they measured through its named fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from tf_otel import record


@dataclass
class StepHandle:
    """One step on this rank, held by the training thread from begin to end."""

    key: str
    step: int
    name: str
    kind: str
    trace_id: int
    sampled: bool
    start_ns: int
    end_ns: int = 0
    attributes: Dict[str, Any] = field(default_factory=dict)
    records: List[record.Record] = field(default_factory=list)
    # callables run on the export thread, each returning more Records of this step
    deferred: List[Callable[[], List[record.Record]]] = field(default_factory=list)
    # what this step waited for input (instrument.data / input_wait): the input wait histogram
    # of every step (step_metrics) and the span's attributes; None: not measured in this step
    input_wait_ns: Optional[int] = None
    error: Optional[str] = None
    thread: int = 0  # the thread it runs on (cluster.stall: whose stack to read)

    def mark_detail(self, what: str) -> None:
        """Say on the span that tf_otel did ``what`` ("ops", "resources") in this step: its own
        reads and CPU are then in the step's process counters (record.ATTR_DETAIL)."""
        marks = self.attributes.setdefault(record.ATTR_DETAIL, [])
        if what not in marks:
            marks.append(what)
