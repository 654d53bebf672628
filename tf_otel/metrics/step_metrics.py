"""Step histograms per rank, with exemplars that open the step's trace.

On the process's MeterProvider (``OTEL_METRICS_EXPORTER=otlp``; with no SDK MeterProvider
nothing is created and the training thread does nothing more)::

    tf_otel.step.duration                  s  every step of this rank, sampled or not
    tf_otel.step.input_wait.duration       s  steps whose input wait was measured
    tf_otel.step.collective_wait.duration  s  collective-detail steps: this rank's wait for the
                                              last rank (union of its collectives' waits)
    tf_otel.rank.lateness                  s  rank 0 only: the ranks' lateness in each step it
                                              judged (cluster/verdicts.py), exemplar: the root

The training thread never calls the SDK: an unsampled step appends one tuple to a bounded deque
(drops counted) that the export thread records (``drain``). A sampled step is recorded with its
step span as context, so the exemplar points at a trace that exists; an unsampled one with an
empty context, so no exemplar names a trace that was never exported. Attributes, buckets
(``BOUNDARIES``) and exemplar filters: docs/guides/OBSERVABILITY.md.

Usage::

    metrics = StepMetrics.create(rank=0)       # None without an SDK MeterProvider
    metrics.add(handle)                        # training thread, an unsampled step
    metrics.drain()                            # export thread
    metrics.record_step(handle, span_context)  # export thread, a sampled step's span
    metrics.record_collective_wait(key, step, records, span_context)
    metrics.record_lateness({rank: ns}, root_span_context, straggler)  # rank 0, a judged step
"""

from __future__ import annotations

import collections
from typing import Any, Deque, Dict, Iterable, Optional, Tuple

from tf_otel import record
from tf_otel.health import count, log_once
from tf_otel.otel.sdk import sdk_meter_provider
from tf_otel.step_handle import StepHandle

STEP_DURATION = "tf_otel.step.duration"
INPUT_WAIT_DURATION = "tf_otel.step.input_wait.duration"
COLLECTIVE_WAIT_DURATION = "tf_otel.step.collective_wait.duration"
RANK_LATENESS = "tf_otel.rank.lateness"

# seconds; a step of 1 ms (tiny model) to a minute (a checkpointing or stalled step)
BOUNDARIES = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    20.0,
    60.0,
)
# unsampled steps waiting for the export thread (~2 per second drains): far more than it needs
MAX_PENDING = 16384
LATENESS_POINTS = 64  # lateness points a step at most (record_lateness)
_RANKS_KEPT = 4096  # data point attribute dicts kept (one per rank; beyond: made per point)
_KINDS_KEPT = 256  # step key/number -> kind, for collective records that arrive after the step

# the collective span attributes (tf_otel.sources horovod parsers) this reads
_ATTR_WAIT = record.ATTR_WAIT_NS
_ATTR_ARRIVAL = record.ATTR_ARRIVAL


def collective_wait_ns(records: Iterable[record.Record]) -> Optional[int]:
    """This rank's time waiting for the last rank in a step's collectives: the union of the
    collectives' wait intervals (fused and concurrent collectives overlap; their sum would count
    one wait several times). None: no collective with a known arrival."""
    intervals = []
    for rec in records:
        if rec.category != record.COLLECTIVE:
            continue
        wait = rec.attributes.get(_ATTR_WAIT)
        if wait is None or rec.attributes.get(_ATTR_ARRIVAL) == "unknown":
            continue
        intervals.append((rec.start_ns, rec.start_ns + max(0, int(wait))))
    if not intervals:
        return None
    intervals.sort()
    total = 0
    lo, hi = intervals[0]
    for start, end in intervals[1:]:
        if start > hi:
            total += hi - lo
            lo, hi = start, end
        else:
            hi = max(hi, end)
    return total + hi - lo


class StepMetrics:
    """The three histograms of one process (one rank)."""

    def __init__(self, meter: Any, rank: int) -> None:
        from opentelemetry.context import Context

        self.rank = rank
        self.pending: Deque[Tuple[str, int, Optional[int]]] = collections.deque()
        self._kinds: Dict[Tuple[str, int], str] = {}
        self._attributes: Dict[str, Dict[str, Any]] = {}  # kind -> data point attributes
        self._no_trace = Context()  # unsampled steps: no span, so no exemplar points anywhere
        advice = list(BOUNDARIES)
        self.duration = meter.create_histogram(
            STEP_DURATION,
            unit="s",
            description="Wall time of one training step on this rank",
            explicit_bucket_boundaries_advisory=advice,
        )
        self.input_wait = meter.create_histogram(
            INPUT_WAIT_DURATION,
            unit="s",
            description="Time a step waited on its input pipeline (tf.data) on this rank",
            explicit_bucket_boundaries_advisory=advice,
        )
        self.collective_wait = meter.create_histogram(
            COLLECTIVE_WAIT_DURATION,
            unit="s",
            description="Time this rank waited for the last rank in a step's collectives",
            explicit_bucket_boundaries_advisory=advice,
        )
        self.lateness = meter.create_histogram(
            RANK_LATENESS,
            unit="s",
            description="How much later than the other ranks' median a rank was ready in a step "
            "(rank 0's live verdicts; 0 for a rank that was early)",
            explicit_bucket_boundaries_advisory=advice,
        )
        self._rank_attributes: Dict[int, Dict[str, Any]] = {}
        self._lateness_cursor = 0

    @classmethod
    def create(cls, rank: int) -> Optional[StepMetrics]:
        """None (nothing created) without an SDK MeterProvider."""
        provider = sdk_meter_provider()
        if provider is None:
            return None
        from tf_otel.version import __version__

        return cls(provider.get_meter("tf_otel", __version__), rank)

    # -- training thread ------------------------------------------------------------------

    def add(self, handle: StepHandle) -> None:
        """An unsampled (or dropped) step: one append, recorded later by ``drain``."""
        if len(self.pending) >= MAX_PENDING:
            count("step_metrics_dropped")
            log_once("step_metrics_full", "tf_otel: step metrics buffer full; points dropped")
            return
        self.pending.append((handle.kind, handle.end_ns - handle.start_ns, handle.input_wait_ns))

    # -- export thread --------------------------------------------------------------------

    def drain(self) -> int:
        """Record the steps ``add`` buffered; the number recorded."""
        done = 0
        pending = self.pending
        while True:
            try:
                kind, duration_ns, wait_ns = pending.popleft()
            except IndexError:
                return done
            self._record(kind, duration_ns, wait_ns, self._no_trace)
            done += 1

    def record_step(self, handle: StepHandle, span_context: Any) -> None:
        """A sampled step whose span (``span_context``, this rank's step span) now exists."""
        from opentelemetry.trace import NonRecordingSpan, set_span_in_context

        context = set_span_in_context(NonRecordingSpan(span_context))
        self._record(
            handle.kind,
            handle.end_ns - handle.start_ns,
            handle.input_wait_ns,
            context,
        )
        self._kinds[(handle.key, handle.step)] = handle.kind
        while len(self._kinds) > _KINDS_KEPT:
            self._kinds.pop(next(iter(self._kinds)))

    def record_collective_wait(
        self, key: str, step: int, records: Iterable[record.Record], span_context: Any
    ) -> None:
        """A step's collective records (they come in one batch per step and rank)."""
        wait_ns = collective_wait_ns(records)
        kind = self._kinds.get((key, step))
        if wait_ns is None or kind is None:
            return
        from opentelemetry.trace import NonRecordingSpan, set_span_in_context

        self.collective_wait.record(
            wait_ns / 1e9,
            self._attrs(kind),
            context=set_span_in_context(NonRecordingSpan(span_context)),
        )

    def record_lateness(
        self, by_rank: Dict[int, int], root_context: Any, straggler: Optional[int] = None
    ) -> None:
        """Rank 0: the ranks' lateness in one judged step: every rank's in a job of up to
        LATENESS_POINTS ranks; in a bigger one the straggler's and a window of the others that
        moves on each step (each rank every ceil(n / LATENESS_POINTS) steps: a point costs
        ~15 us in the SDK, 1,024 a step would be ~20 ms). The straggler's point carries the step
        root as its exemplar; the others none."""
        from opentelemetry.trace import NonRecordingSpan, set_span_in_context

        ranks = list(by_rank)
        if len(ranks) > LATENESS_POINTS:
            ranks.sort()
            start = self._lateness_cursor % len(ranks)
            self._lateness_cursor = start + LATENESS_POINTS
            chosen = (ranks + ranks)[start : start + LATENESS_POINTS]
            if straggler is not None and straggler not in chosen:
                chosen.append(straggler)
            ranks = chosen
        record_point = self.lateness.record
        for rank in ranks:
            attributes = self._rank_attributes.get(rank)
            if attributes is None:
                attributes = {record.ATTR_RANK: rank}
                if len(self._rank_attributes) < _RANKS_KEPT:
                    self._rank_attributes[rank] = attributes
            context = self._no_trace
            if rank == straggler:
                context = set_span_in_context(NonRecordingSpan(root_context))
            record_point(max(0, by_rank[rank]) / 1e9, attributes, context=context)

    def _record(self, kind: str, duration_ns: int, wait_ns: Optional[int], context: Any) -> None:
        attributes = self._attrs(kind)
        self.duration.record(max(0, duration_ns) / 1e9, attributes, context=context)
        if wait_ns is not None:
            self.input_wait.record(max(0, wait_ns) / 1e9, attributes, context=context)

    def _attrs(self, kind: str) -> Dict[str, Any]:
        attributes = self._attributes.get(kind)
        if attributes is None:
            attributes = {record.ATTR_RANK: self.rank, record.ATTR_STEP_KIND: kind}
            self._attributes[kind] = attributes
        return attributes
