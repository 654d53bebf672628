"""The export thread: a rank's queued steps and late Records -> spans, and rank 0's step roots.

Usage (the Pipeline owns one; nothing else calls it)::

    exporter = StepExporter(topology, tracer, ids, metrics, queue)
    exporter.services = start_services(..., emit_root=exporter.emit_root, ...)
    threading.Thread(target=exporter.run).start()   # until a None comes off the queue

The training thread only puts ``StepHandle`` objects (ended steps) and ``(key, step, records)``
tuples (records produced elsewhere for a step; those of a step that has not ended here wait
for it) on the queue; every span is built here.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Dict, List, Optional

from tf_otel import clock, record
from tf_otel.clock.sync import SETTLED_ROUNDS
from tf_otel.cluster.baseline import EVENT as BASELINE_EVENT
from tf_otel.cluster.baseline import LiveBaseline
from tf_otel.cluster.coordinator import Extent
from tf_otel.cluster.services import Services
from tf_otel.cluster.verdicts import Change, LiveVerdicts, slowdown_record, verdict_attributes
from tf_otel.cluster.world import WorldHistory
from tf_otel.health import count, fail_open, log_once
from tf_otel.job.topology import Topology
from tf_otel.otel.ids import (
    PrimedIdGenerator,
    step_rank_span_id,
    step_root_span_id,
    step_trace_id,
)
from tf_otel.otel.span_builder import SpanBuilder
from tf_otel.otel.trace_log import log_in_trace
from tf_otel.step_handle import StepHandle

_STEP_CACHE = 256  # step span contexts kept for records that arrive after their step
# steps whose records came before the step ended on this rank (rank 0 parsed its Horovod
# timeline while this rank was still in the step): the records wait for the step's export
_EARLY_STEPS = 64
_US = 1000
ATTR_TEST_CLOCK_ERROR = "tf_otel.clock.test_error_ns"
EXPORT_INTERVAL_S = 0.5


class StepExporter:
    """Records -> spans under this rank's step spans; rank 0's roots over every rank."""

    def __init__(
        self,
        topology: Topology,
        tracer: Any,
        ids: Optional[PrimedIdGenerator],
        metrics: Any,
        steps: queue.SimpleQueue[Any],
    ) -> None:
        self.topology = topology  # Pipeline.adopt may replace it before the first step
        self.tracer = tracer
        self.ids = ids  # None: a foreign TracerProvider (no cross-rank ids, no roots)
        self.metrics = metrics  # step histograms (metrics.step_metrics); None: no metrics
        self.queue = steps
        self.services = Services()  # the started ones from the first step
        self.verdicts: Optional[LiveVerdicts] = None  # rank 0: the live verdicts (verdicts.py)
        self.baseline: Optional[LiveBaseline] = None  # rank 0: TF_OTEL_BASELINE (baseline.py)
        # the world of each step where it changed while the job ran (Horovod Elastic)
        self.world: Optional[WorldHistory] = None
        self.spans = SpanBuilder(tracer)  # records' spans, direct where equivalent
        self.closed = False
        # rank 0 is the clock reference: it runs no rounds, so there is nothing to settle
        self.clock_settled = topology.is_reference
        self._wake = threading.Event()  # no pause before the next batch (wake, shutdown)
        self._steps: Dict[tuple, Any] = {}  # (key, step) -> (span context, start, end), bounded
        self._early: Dict[tuple, List[record.Record]] = {}  # (key, step) -> records, bounded

    @property
    def job_id(self) -> str:
        return self.topology.job_id

    @property
    def trace_scope(self) -> str:
        """What the step ids hash: the job id and the attempt (``Topology.trace_scope``)."""
        return self.topology.trace_scope

    def wake(self) -> None:
        self._wake.set()

    def run(self) -> None:
        """Convert queued steps in batches, EXPORT_INTERVAL_S apart: every wake-up of this thread
        may hold the GIL just when the training thread comes back from TF's C++ and then costs
        it up to the interpreter's switch interval (5 ms), so fewer, larger bursts are cheaper
        for training than one burst per step (measured: bench/bench_steps_inprocess.py)."""
        metrics = self.metrics
        while True:
            try:  # with step metrics, wake up now and then to record the unsampled steps
                batch = [self.queue.get(timeout=EXPORT_INTERVAL_S if metrics else None)]
            except queue.Empty:
                batch = []
            while True:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            if metrics is not None:
                with fail_open("step_metrics.drain"):
                    metrics.drain()
            for item in batch:
                if item is None:
                    if self._early:  # records of steps that never ended here: lost, counted
                        count("records_orphaned", len(self._early))
                        self._early.clear()
                    return
                self._wait_for_clock()
                with fail_open("export.step"):
                    if isinstance(item, StepHandle):
                        self.export_step(item)
                    else:
                        self.export_late(*item)
            if self._wake.wait(EXPORT_INTERVAL_S) and not self.closed:
                self._wake.clear()  # a one-off wake(); at shutdown it stays set

    def clock_settled_now(self) -> bool:
        """Whether the clock model has settled, from any thread, never waiting: the sync's own
        rounds, not only ``clock_settled``, which this thread sets when it takes a step (the
        first one's batch comes at that step's end, after a tf.function's tracing: seconds
        under load, while the rounds settle in a fraction of one)."""
        if self.clock_settled:
            return True
        sync = self.services.clock_sync
        return sync is not None and sync.stats.rounds >= SETTLED_ROUNDS

    def _wait_for_clock(self) -> None:
        """Early steps wait (on this thread, queued) until the clock model has a drift estimate
        from several rounds; a model from one or two rounds can be off by tens of us a second.
        Never on rank 0 (settled from the start: its clock is the reference)."""
        sync = self.services.clock_sync
        if sync is None or self.closed or self.clock_settled:
            return
        while not self.closed and time.monotonic() < self.services.clock_deadline:
            if sync.wait_rounds(SETTLED_ROUNDS, 0.05):
                self.clock_settled = True
                return
        if not self.closed:
            log_once(
                "clock_unsettled",
                "tf_otel: clock sync with rank 0 has not settled; "
                "exporting with the offsets known so far",
            )
            self.clock_settled = True

    def step_attributes(self, handle: StepHandle, model: Any) -> Dict[str, Any]:
        """A step span's attributes (a copy: the training thread may still add to the
        handle's own while an in-flight step is exported)."""
        return {
            record.ATTR_CATEGORY: record.STEP,
            record.ATTR_RANK: self.topology.rank,
            record.ATTR_STEP: handle.step,
            record.ATTR_STEP_KIND: handle.kind,
            record.ATTR_CLOCK_OFFSET: model.offset_at(handle.start_ns),
            record.ATTR_CLOCK_UNCERTAINTY: model.uncertainty_ns,
            **dict(handle.attributes),
        }

    def _root_context(self, handle: StepHandle) -> Any:
        """The step root's span context as a remote parent (sampled: rank 0 records it)."""
        from opentelemetry.trace import (
            NonRecordingSpan,
            SpanContext,
            TraceFlags,
            set_span_in_context,
        )

        root = SpanContext(
            trace_id=handle.trace_id,
            span_id=step_root_span_id(self.trace_scope, handle.key, handle.step),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        return set_span_in_context(NonRecordingSpan(root))

    def export_step(self, handle: StepHandle) -> None:
        from opentelemetry.trace import Status, StatusCode

        model = clock.current_model()
        start = model.to_reference(handle.start_ns)
        end = max(start, model.to_reference(handle.end_ns))
        attributes = self.step_attributes(handle, model)
        gpu = self.services.gpu
        if gpu is not None:  # the step's GPU summary from the sampler's ring, no NVML call
            with fail_open("gpu_metrics.step_summary"):
                attributes.update(
                    gpu.step_summary(self.topology.local_rank, handle.start_ns, handle.end_ns)
                )
        injected = clock.test_clock()
        if injected is not None:  # TF_OTEL_TEST_CLOCK (tests only): the error we should undo
            attributes[ATTR_TEST_CLOCK_ERROR] = injected.error_at_local(handle.start_ns)
        if self.ids is not None:  # the id the step context announced at step begin
            self.ids.prime(
                handle.trace_id,
                step_rank_span_id(self.trace_scope, handle.key, handle.step, self.topology.rank),
            )
        span = self.tracer.start_span(
            f"rank {self.topology.rank} {handle.name}",
            context=self._root_context(handle),
            start_time=start,
            attributes=attributes,
        )
        if handle.error:
            span.set_status(Status(StatusCode.ERROR, handle.error))
        span.end(end_time=end)
        self._remember(handle.key, handle.step, (span.get_span_context(), start, end))
        if self.metrics is not None:  # exemplars point at this rank's step span
            with fail_open("step_metrics.record"):
                self.metrics.record_step(handle, span.get_span_context())
        records = list(handle.records)
        records.extend(self._early.pop((handle.key, handle.step), ()))
        for produce in handle.deferred:
            with fail_open("export.deferred"):
                records.extend(produce() or ())
        _place_nccl(records)
        self.export_records(handle.step, records, span.get_span_context(), start, end)
        self._record_collective_wait(handle.key, handle.step, records, span.get_span_context())
        self.services.report(
            self.topology.rank, handle.key, handle.step, start, end, handle.input_wait_ns
        )

    def export_in_step(
        self, handle: StepHandle, name: str, start_ns: int, end_ns: int, attributes: Dict
    ) -> Any:
        """A span in the step's trace, child of the step's root span id (a remote parent,
        recorded whatever the step's sampling: stall records and in-flight steps are rare),
        from local times; returns its span context."""
        model = clock.current_model()
        start = model.to_reference(start_ns)
        end = max(start, model.to_reference(end_ns))
        span = self.tracer.start_span(
            name, context=self._root_context(handle), start_time=start, attributes=attributes
        )
        span.end(end_time=end)
        return span.get_span_context()

    def _remember(self, key: str, step: int, value: Any) -> None:
        self._steps[(key, step)] = value
        while len(self._steps) > _STEP_CACHE:
            self._steps.pop(next(iter(self._steps)))

    def export_late(self, key: str, step: int, records: List[record.Record]) -> None:
        known = self._steps.get((key, step))
        if known is None:  # the step has not ended here yet: its export takes them
            self._early.setdefault((key, step), []).extend(records)
            while len(self._early) > _EARLY_STEPS:
                self._early.pop(next(iter(self._early)))
                count("records_orphaned")
            return
        self.export_records(step, records, *known)
        self._record_collective_wait(key, step, records, known[0])

    def _record_collective_wait(
        self, key: str, step: int, records: List[record.Record], step_ctx: Any
    ) -> None:
        if self.metrics is not None and records:
            with fail_open("step_metrics.record"):
                self.metrics.record_collective_wait(key, step, records, step_ctx)

    def export_records(
        self, step: int, records: List[record.Record], step_ctx: Any, lo: int, hi: int
    ) -> None:
        """Records -> spans under the step span; every child clamped inside its parent."""
        if not records:
            return
        model = clock.current_model()
        by_id = {r.record_id: r for r in records}
        done: Dict[int, Any] = {}

        def emit(rec: record.Record) -> Any:
            if rec.record_id in done:
                return done[rec.record_id]
            done[rec.record_id] = None  # cycle guard
            parent_ctx, p_lo, p_hi = step_ctx, lo, hi
            if rec.parent_id is not None and rec.parent_id in by_id:
                parent = emit(by_id[rec.parent_id])
                if parent is not None:
                    parent_ctx, p_lo, p_hi = parent
            start = model.to_reference(rec.start_ns)
            end = model.to_reference(rec.end_ns)
            if start < p_lo or end > p_hi:
                count("spans_clamped")
            # Backends that keep microseconds (Jaeger) truncate start and duration separately:
            # a child must end a microsecond before its parent to stay inside it there too.
            limit = p_hi - _US if p_hi - p_lo > 2 * _US else p_hi
            start = min(max(start, p_lo), limit)
            end = min(max(end, start), limit)
            attributes = {
                record.ATTR_CATEGORY: rec.category,
                record.ATTR_RANK: self.topology.rank,
                record.ATTR_STEP: step,
                record.ATTR_CLOCK_OFFSET: model.offset_at(rec.start_ns),
                record.ATTR_CLOCK_UNCERTAINTY: model.uncertainty_ns,
                **rec.attributes,
            }
            ctx = self.spans.finished(rec.name, parent_ctx, start, end, attributes)
            done[rec.record_id] = (ctx, start, end)
            return done[rec.record_id]

        for rec in records:
            emit(rec)

    def emit_root(
        self,
        key: str,
        step: int,
        start_ns: int,
        end_ns: int,
        ranks: int,
        reported: Optional[tuple] = None,
        extents: Optional[Dict[int, Extent]] = None,
    ) -> None:
        """Rank 0 (the coordinator's thread): the step's root over every rank; ``reported``:
        the ranks heard from when some rank never reported the step (killed mid-step, or
        later than the wait) -> marked partial; ``extents``: each rank's, for the verdict."""
        from opentelemetry.context import Context
        from opentelemetry.trace import Link

        if self.ids is None:
            return
        links = []
        job_span = self.services.job_span
        if job_span is not None and job_span.get_span_context().is_valid:
            links.append(Link(job_span.get_span_context()))
        self.ids.prime(
            step_trace_id(self.trace_scope, key, step),
            step_root_span_id(self.trace_scope, key, step),
        )
        world, step_world = self.topology.world_size, self.topology.step_world_size
        history = self.world
        if history is not None:  # the world that ran this step (Horovod Elastic)
            world = step_world = history.size_of(key, step)
        span = self.tracer.start_span(
            f"{key} step {step}",
            context=Context(),
            links=links,
            start_time=start_ns,
            attributes={
                record.ATTR_CATEGORY: record.STEP_ROOT,
                record.ATTR_STEP: step,
                record.ATTR_JOB_ID: self.job_id,
                record.ATTR_STEP_RANKS: ranks,
                record.ATTR_WORLD_SIZE: world,
                record.ATTR_STEP_WORLD_SIZE: step_world,
            },
        )
        if history is not None:
            members = history.ranks_of(key, step)
            if members != tuple(range(len(members))):
                span.set_attribute(record.ATTR_STEP_WORLD_RANKS, list(members))
            changed = history.first_step_of(key, step)
            if changed is not None:  # the first step of a new world says what changed
                span.add_event(record.WORLD_CHANGE, changed.attributes(key), timestamp=start_ns)
        if reported is not None:
            span.set_attribute("tf_otel.step.partial", True)
            span.set_attribute("tf_otel.step.ranks_reported", list(reported))
        verdict = None
        if self.verdicts is not None and extents:
            with fail_open("verdicts.judge"):
                verdict = self.verdicts.judge(key, step, extents)
                if verdict is not None:
                    span.set_attributes(verdict_attributes(verdict))
        if self.baseline is not None and reported is None:
            with fail_open("baseline.observe"):
                late = verdict.by_rank_ns if verdict is not None and verdict.judged else None
                window = self.baseline.observe(key, step, end_ns - start_ns, late)
                if window is not None and window.slower:
                    span.add_event(BASELINE_EVENT, window.attributes(), timestamp=end_ns)
                    count("baseline_slower_windows")
        span.end(end_time=end_ns)
        if verdict is not None and verdict.judged:
            if self.metrics is not None:
                with fail_open("verdicts.lateness"):
                    self.metrics.record_lateness(
                        verdict.by_rank_ns, span.get_span_context(), verdict.rank
                    )
            for change in verdict.changes:
                with fail_open("verdicts.slowdown"):
                    self._export_slowdown(change)

    def _export_slowdown(self, change: Change) -> None:
        """A slowdown that began (in the trace of the step it began at) or ended (in this
        step's): a span under that step's root and within its time, and a log record in its
        trace."""
        name, attributes, summary = slowdown_record(change)
        attributes[record.ATTR_CATEGORY] = record.SLOWDOWN
        attributes[record.ATTR_STEP] = change.since_step if change.began else change.step
        attributes[record.ATTR_STEP_KEY] = change.key
        step = attributes[record.ATTR_STEP]
        trace_id = step_trace_id(self.trace_scope, change.key, step)
        start_ns, end_ns = change.start_ns, change.end_ns
        handle = StepHandle(change.key, step, "slowdown", "", trace_id, True, start_ns, end_ns)
        span = self.tracer.start_span(
            name,
            context=self._root_context(handle),
            start_time=start_ns,
            attributes=attributes,
        )
        span.add_event(f"tf_otel.slowdown.{attributes[record.ATTR_SLOWDOWN_STATE]}")
        span.end(end_time=end_ns)
        count("slowdowns_began" if change.began else "slowdowns_ended")
        level = logging.WARNING if change.began else logging.INFO
        log_in_trace(level, summary, attributes, span.get_span_context())


def _place_nccl(records: List[record.Record]) -> None:
    """NCCL collectives (the plugin's ring, an XSpace) under the step's collective spans that
    launched them (TF's collective ops, Horovod's), where the step has both."""
    if not any(r.category == record.COLLECTIVE for r in records):
        return
    loose = [r for r in records if r.category == record.KERNEL and r.parent_id is None]
    if loose:
        with fail_open("export.nccl_parents"):
            from tf_otel.sources.xplane_gpu import place_under_collectives

            place_under_collectives(loose, records)
