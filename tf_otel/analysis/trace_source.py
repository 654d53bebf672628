"""Where the analysis reads each trace's spans from, one trace at a time.

Usage::

    source = MemorySource(spans)             # spans already in memory (Jaeger, Tempo, tests)
    source = load.spill.load_spilled(paths)  # trace files, spans kept on disk by trace
    for trace_id in source.trace_ids():
        spans = source.spans(trace_id)       # that trace's spans, in input order

The analysis asks for a trace's spans when it builds the step and again when it analyses it
(``analyze.analyze_source``), so at any time it holds only the steps it is working on and a few
values per step: memory depends on the steps in flight, not on the job. A source that also has
``skeleton(trace_id)`` (``load.spill.SpillSource``) is asked for that instead, and the step is
built from it where it can be (``analysis.skeleton``).
"""

from __future__ import annotations

from typing import List, Protocol, Set

from tf_otel.analysis.model import Span
from tf_otel.analysis.steps import job_ids, spans_by_trace


class TraceSource(Protocol):
    # True: ``spans`` builds new objects on every call (the causality repair runs each time);
    # False: the same objects every time (repaired once)
    fresh: bool

    def trace_ids(self) -> List[str]: ...

    def spans(self, trace_id: str) -> List[Span]: ...

    def job_ids(self) -> Set[str]: ...

    def view(self, trace_ids: List[str]) -> TraceSource:
        """A source of these traces only, to send to an engine's worker (``analysis.engine``)."""
        ...


class MemorySource:
    """Spans held in memory, split by trace (input order kept)."""

    fresh = False

    def __init__(self, spans: List[Span]) -> None:
        self._traces = spans_by_trace(spans)
        self._jobs = job_ids(spans)

    def trace_ids(self) -> List[str]:
        return list(self._traces)

    def spans(self, trace_id: str) -> List[Span]:
        return self._traces.get(trace_id, [])

    def job_ids(self) -> Set[str]:
        return set(self._jobs)

    def view(self, trace_ids: List[str]) -> MemorySource:
        return self  # never sent to another process: the spans are here
