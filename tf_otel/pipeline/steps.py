"""Step traces: ids shared by all ranks, sampling, Record -> span on a background thread.

The training thread only calls ``begin_step`` / ``end_step`` (a counter, a hash and a sampler
call; for unsampled steps nothing else but, with a MeterProvider, one append for the step
histograms, pipeline/step_metrics.py) and ``add_records``; spans are built and exported
elsewhere. See docs/ARCHITECTURE.md for the contract.

Usage::

    pipeline = get_pipeline()  # tf_otel.pipeline.lifecycle
    step = pipeline.begin_step("keras_train", "keras.train_function", record.KERAS_TRAIN)
    ...  # the step runs
    pipeline.end_step(step)
"""

from __future__ import annotations

import itertools
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from tf_otel import clock, record
from tf_otel.config import Settings
from tf_otel.health import count, counters, fail_open, log_once, logger
from tf_otel.job.topology import Topology
from tf_otel.pipeline.coordinator import CoordinatorClient, StepAggregator
from tf_otel.pipeline.ids import (
    PrimedIdGenerator,
    fast_root_decision,
    step_rank_span_id,
    step_root_span_id,
    step_trace_id,
)
from tf_otel.pipeline.messages import Handlers, Outgoing
from tf_otel.pipeline.span_builder import SpanBuilder
from tf_otel.pipeline.stall import StepTracker, frame_lines, stack_of

_STEP_CACHE = 256  # step span contexts kept for records that arrive after their step
_IN_FLIGHT_EXPORTED = 64  # (key, step) of in-flight step spans already exported, kept
_US = 1000
ATTR_TEST_CLOCK_ERROR = "tf_otel.clock.test_error_ns"
CLOCK_SETTLED_ROUNDS = 6  # warm-up rounds at 10, 20, 40 ... ms: a drift baseline of ~0.3 s
CLOCK_SETTLE_MAX_S = 15.0
EXPORT_INTERVAL_S = 0.5


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
    deferred: List[Any] = field(default_factory=list)
    # free-form per-step state for StepHooks (e.g. "ops": True on op-traced steps)
    flags: Dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None
    thread: int = 0  # the thread it runs on (pipeline.stall: whose stack to read)


def _metrics_resource(topology: Topology) -> Dict[str, Any]:
    """What tf_otel's health metrics add to the MeterProvider's resource."""
    return {
        "host.name": topology.host,
        "process.pid": os.getpid(),
        record.ATTR_RANK: topology.rank,
        record.ATTR_WORLD_SIZE: topology.world_size,
        record.ATTR_JOB_ID: topology.job_id,
    }


class Pipeline:
    """The per-process tracing state: step counters, sampling, the export thread, rank 0's roots."""

    def __init__(self, settings: Settings, topology: Topology, tracer_provider: Any = None) -> None:
        from opentelemetry import trace

        from tf_otel.version import __version__

        self.settings = settings
        self.topology = topology
        self.job_id = topology.job_id
        self._tracer_provider = tracer_provider
        with fail_open("resource"):  # on the tracer and the logger provider (OTLP logs)
            from tf_otel.pipeline.sdk import merge_topology_resource

            merge_topology_resource(topology, tracer_provider)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with fail_open("health_metrics"):
            from tf_otel.pipeline import health_metrics

            health_metrics.register(_metrics_resource(topology), step_queue_depth=self._queue.qsize)
        self._metrics: Any = None  # step histograms (pipeline.step_metrics); None: no metrics
        with fail_open("step_metrics"):
            from tf_otel.pipeline.step_metrics import StepMetrics

            self._metrics = StepMetrics.create(topology.rank)
        self._tracer = trace.get_tracer("tf_otel", __version__, tracer_provider=tracer_provider)
        self._sampler = getattr(self._tracer, "sampler", None)
        self._spans = SpanBuilder(self._tracer)  # records' spans, direct where equivalent
        self._sample_fast = fast_root_decision(self._sampler)
        self._ids: Optional[PrimedIdGenerator] = None
        if hasattr(self._tracer, "id_generator"):
            self._ids = PrimedIdGenerator(self._tracer.id_generator)
            self._tracer.id_generator = self._ids
        else:
            log_once(
                "no_sdk",
                "tf_otel: the TracerProvider is not the OpenTelemetry SDK's; step root spans "
                "cannot get their cross-rank ids",
            )
        self.handlers = Handlers()  # extension messages between ranks (pipeline.messages)
        self.tracer_provider = tracer_provider  # None: the global one
        # steps in flight and last completed (pipeline.stall); rank 0 keeps recent durations
        self.tracker = StepTracker(durations=topology.is_reference and settings.stall)
        self._in_flight_exported: Dict[tuple, None] = {}
        self._in_flight_lock = threading.Lock()
        self._stall_watch: Any = None
        if settings.stall:  # before the coordinator link exists: no question goes unanswered
            with fail_open("stall.register"):
                from tf_otel.pipeline import stall

                stall.register(self)
        self._counters: Dict[str, Any] = {}  # step key -> itertools.count
        self._steps: Dict[tuple, Any] = {}  # (key, step) -> (span context, start, end), bounded
        self._job_span: Any = None
        self._aggregator: Optional[StepAggregator] = None
        self._client: Optional[CoordinatorClient] = None
        self._clock_sync: Any = None
        # rank 0 is the clock reference: it runs no rounds, so there is nothing to settle
        self._clock_settled = topology.is_reference
        self._gpu: Any = None  # GPU metrics sampler (None without NVML / GPU)
        self._system: Any = None  # host/process metrics (tf_otel.pipeline.system_metrics)
        self._clock_deadline = 0.0
        self._started = False
        self._closed = False
        self._start_lock = threading.Lock()
        self._worker = threading.Thread(target=self._work, name="tf_otel-export", daemon=True)
        self._wake = threading.Event()  # no pause before the next batch (wake, shutdown)

    @property
    def started(self) -> bool:
        """True once a step has begun (the services and the export thread run)."""
        return self._started

    def adopt(self, topology: Topology) -> bool:
        """Take another identity (the cluster the program gave its tf.distribute.Server,
        pipeline/lifecycle.learn_cluster) while no step has begun: nothing that carries the
        identity exists before the first step (services start there, resources are merged
        again here). False, and nothing changes, once a step has begun."""
        with self._start_lock:
            if self._started:
                return False
            self.topology = topology
            self.job_id = topology.job_id
            self._clock_settled = topology.is_reference
            if self._metrics is not None:
                self._metrics.rank = topology.rank
            with fail_open("resource"):
                from tf_otel.pipeline.sdk import merge_topology_resource, sdk_meter_provider

                merge_topology_resource(topology, self._tracer_provider)
                from tf_otel.pipeline import health_metrics

                health_metrics.merge_resource(sdk_meter_provider(), _metrics_resource(topology))
            return True

    # -- training-thread side -------------------------------------------------------------

    def begin_step(self, key: str, name: str, kind: str, **attributes: Any) -> StepHandle:
        if not self._started:
            self._start()
        counter = self._counters.get(key)
        if counter is None:  # setdefault is atomic: closure threads (TF2 PS) may race here
            counter = self._counters.setdefault(key, itertools.count())
        step = next(counter)
        trace_id = step_trace_id(self.job_id, key, step)
        handle = StepHandle(
            key=key,
            step=step,
            name=name,
            kind=kind,
            trace_id=trace_id,
            sampled=self._is_sampled(trace_id, name),
            start_ns=clock.now_ns(),
            attributes=attributes,
        )
        self.tracker.begin(handle)
        return handle

    def end_step(self, handle: StepHandle, error: Optional[BaseException] = None) -> None:
        handle.end_ns = clock.now_ns()
        self.tracker.end(handle)
        if not handle.sampled or self._closed:
            if self._metrics is not None:  # one append; the export thread records it
                self._metrics.add(handle)
            return
        if error is not None:
            handle.error = type(error).__name__
        if self._queue.qsize() >= self.settings.max_queue:
            count("steps_dropped")
            log_once("queue_full", "tf_otel: export queue full; dropping step spans (counted)")
            if self._metrics is not None:  # no span, still a step
                self._metrics.add(handle)
            return
        self._queue.put(handle)

    def add_records(self, key: str, step: int, records: List[record.Record]) -> None:
        """Records of a step that were produced after it ended (e.g. parsed timelines)."""
        if records and not self._closed:
            if self._queue.qsize() >= self.settings.max_queue:  # bounded like end_step's
                count("records_dropped", len(records))
                return
            self._queue.put((key, step, records))

    # -- cross-rank extension messages (pipeline.messages; handlers in self.handlers) --

    def send_to_reference(self, message: Outgoing) -> None:
        """From a rank > 0: queue an extension message for rank 0 (dropped if unconnected)."""
        if self._client is not None:
            self._client.send(message)

    def send_to_rank(self, rank: int, message: Outgoing) -> bool:
        """From rank 0: send an extension message to one rank."""
        return self._aggregator is not None and self._aggregator.send(rank, message)

    def broadcast(self, message: Outgoing) -> int:
        """From rank 0: send an extension message to every connected rank."""
        return self._aggregator.broadcast(message) if self._aggregator is not None else 0

    def connected_ranks(self) -> set:
        """From rank 0: the ranks connected to its coordinator now."""
        return self._aggregator.connected_ranks() if self._aggregator is not None else set()

    # -- steps in flight (pipeline.stall; SIGTERM / exit mid-step) ---------------------------

    def export_in_flight(self, reason: str) -> int:
        """Export this rank's steps in flight as step spans marked ``tf_otel.step.in_flight``,
        ended now (each (key, step) once); from any thread but the training thread's own
        steps. Returns how many were exported."""
        exported = 0
        for handle in self.tracker.flights():
            with self._in_flight_lock:
                if (handle.key, handle.step) in self._in_flight_exported:
                    continue
                self._in_flight_exported[(handle.key, handle.step)] = None
                while len(self._in_flight_exported) > _IN_FLIGHT_EXPORTED:
                    self._in_flight_exported.pop(next(iter(self._in_flight_exported)))
            with fail_open("export.in_flight"):
                attributes = {
                    **self._step_attributes(handle, clock.current_model()),
                    record.ATTR_STEP_IN_FLIGHT: True,
                    record.ATTR_STEP_IN_FLIGHT_REASON: reason,
                    record.ATTR_STEP_STACK: frame_lines(stack_of(handle.thread)),
                }
                name = f"rank {self.topology.rank} {handle.name}"
                self.export_in_step(handle, name, handle.start_ns, clock.now_ns(), attributes)
                count("steps_exported_in_flight")
                exported += 1
        return exported

    def export_in_step(
        self, handle: StepHandle, name: str, start_ns: int, end_ns: int, attributes: Dict
    ) -> Any:
        """A span in the step's trace, child of the step's root span id (a remote parent,
        recorded whatever the step's sampling: stall records and in-flight steps are rare),
        from local times; returns its span context."""
        from opentelemetry.trace import (
            NonRecordingSpan,
            SpanContext,
            TraceFlags,
            set_span_in_context,
        )

        model = clock.current_model()
        start = model.to_reference(start_ns)
        end = max(start, model.to_reference(end_ns))
        root = SpanContext(
            trace_id=handle.trace_id,
            span_id=step_root_span_id(self.job_id, handle.key, handle.step),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        span = self._tracer.start_span(
            name,
            context=set_span_in_context(NonRecordingSpan(root)),
            start_time=start,
            attributes=attributes,
        )
        span.end(end_time=end)
        return span.get_span_context()

    def _is_sampled(self, trace_id: int, name: str) -> bool:
        if self._sample_fast is not None:
            return self._sample_fast(trace_id)
        from opentelemetry.context import Context

        try:
            # an empty context: a user's span around fit() must not change the decision
            # no sampler (a foreign tracer): the AttributeError is counted below, the step sampled
            return self._sampler.should_sample(  # type: ignore[union-attr]
                Context(), trace_id, name
            ).decision.is_sampled()
        except Exception:  # noqa: BLE001
            count("sampler_errors")
            return True

    # -- start / stop ---------------------------------------------------------------------

    def _start(self) -> None:
        with self._start_lock:
            if self._started:
                return
            self._started = True
            with fail_open("pipeline.start"):
                self._start_services()
            self._worker.start()
            if self.topology.is_reference and self.settings.stall:
                with fail_open("stall.start"):
                    from tf_otel.pipeline import stall

                    self._stall_watch = stall.start_watch(self)

    def _start_services(self) -> None:
        topo = self.topology
        address = self.settings.coordinator or topo.coordinator_address()
        wait_s = self.settings.root_wait_ms / 1000.0
        if topo.is_reference:
            self._start_job_span()
            self._aggregator = StepAggregator(
                topo.step_world_size, wait_s, self._emit_root, handlers=self.handlers
            )
            if topo.world_size > 1 and address is not None:
                bind_host = "127.0.0.1" if address[0] in ("127.0.0.1", "localhost") else "0.0.0.0"
                self._aggregator.serve((bind_host, address[1]))
        elif address is not None:
            self._client = CoordinatorClient(
                address, topo.rank, self.settings.max_queue, handlers=self.handlers
            )
        else:
            log_once(
                "no_coordinator",
                "tf_otel: rank 0's host is unknown (multi-host launch); set "
                "TF_OTEL_COORDINATOR=host:port so step roots cover every rank",
            )
        if self.settings.gpu_metrics_interval_s > 0:
            with fail_open("gpu_metrics.start"):
                from tf_otel.pipeline.gpu_metrics import start_gpu_metrics

                self._gpu = start_gpu_metrics(
                    {
                        record.ATTR_RANK: topo.rank,
                        record.ATTR_JOB_ID: self.job_id,
                        "host.name": topo.host,
                    },
                    interval_s=self.settings.gpu_metrics_interval_s,
                )
        with fail_open("system_metrics.start"):  # host/process semconv metrics, off-thread
            from tf_otel.pipeline import system_metrics

            self._system = system_metrics.start(
                {
                    record.ATTR_RANK: topo.rank,
                    record.ATTR_WORLD_SIZE: topo.world_size,
                    record.ATTR_JOB_ID: self.job_id,
                    "host.name": topo.host,
                },
                interval_s=self.settings.system_metrics_interval_s,
            )
        with fail_open("clock.start"):
            from tf_otel.clock import sync

            self._clock_sync = sync.start_sync(topo, self.settings)
            self._clock_deadline = time.monotonic() + CLOCK_SETTLE_MAX_S

    def _start_job_span(self) -> None:
        from opentelemetry.propagate import extract

        carrier = {}
        for env_name, header in (("TRACEPARENT", "traceparent"), ("TRACESTATE", "tracestate")):
            if os.environ.get(env_name):
                carrier[header] = os.environ[env_name]
        parent = extract(carrier) if carrier else None
        script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        self._job_span = self._tracer.start_span(
            f"training job {script}",
            context=parent,
            start_time=clock.now_ns(),
            attributes={
                record.ATTR_CATEGORY: record.JOB,
                record.ATTR_JOB_ID: self.job_id,
                record.ATTR_WORLD_SIZE: self.topology.world_size,
                record.ATTR_LAUNCHER: self.topology.launcher,
            },
        )

    def wake(self) -> None:
        """Convert what is queued now instead of at the next batch interval."""
        self._wake.set()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        if self._closed or not self._started:
            self._closed = True
            return
        self._closed = True
        if self._stall_watch is not None:
            self._stall_watch.stop()
        with fail_open("shutdown.in_flight"):  # SIGTERM / exit in the middle of a step
            self.export_in_flight(reason="exit")
        self._queue.put(None)
        self._wake.set()
        self._worker.join(timeout_s)
        if self._metrics is not None:  # steps that ended while the worker stopped
            with fail_open("step_metrics.drain"):
                self._metrics.drain()
        if self._client is not None:
            self._client.close(min(timeout_s, 2.0))
        if self._aggregator is not None:
            self._aggregator.flush(min(timeout_s, self.settings.root_wait_ms / 1000.0))
            self._aggregator.close()
        if self._clock_sync is not None:
            with fail_open("clock.stop"):
                self._clock_sync.stop()
        if self._gpu is not None:
            with fail_open("gpu_metrics.stop"):
                self._gpu.stop()
        if self._system is not None:
            with fail_open("system_metrics.stop"):
                self._system.stop(min(timeout_s, 2.0))
        if self._job_span is not None:
            self._job_span.end(end_time=clock.now_ns())
        if counters:
            logger.debug("tf_otel counters: %s", dict(counters))

    # -- export-thread side ---------------------------------------------------------------

    def _work(self) -> None:
        """Convert queued steps in batches, EXPORT_INTERVAL_S apart: every wake-up of this thread
        may hold the GIL just when the training thread comes back from TF's C++ and then costs
        it up to the interpreter's switch interval (5 ms), so fewer, larger bursts are cheaper
        for training than one burst per step (measured: bench/bench_steps_inprocess.py)."""
        metrics = self._metrics
        while True:
            try:  # with step metrics, wake up now and then to record the unsampled steps
                batch = [self._queue.get(timeout=EXPORT_INTERVAL_S if metrics else None)]
            except queue.Empty:
                batch = []
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if metrics is not None:
                with fail_open("step_metrics.drain"):
                    metrics.drain()
            for item in batch:
                if item is None:
                    return
                self._wait_for_clock()
                with fail_open("export.step"):
                    if isinstance(item, StepHandle):
                        self._export_step(item)
                    else:
                        self._export_late(*item)
            if self._wake.wait(EXPORT_INTERVAL_S) and not self._closed:
                self._wake.clear()  # a one-off wake(); at shutdown it stays set

    def _wait_for_clock(self) -> None:
        """Early steps wait (on this thread, queued) until the clock model has a drift estimate
        from several rounds; a model from one or two rounds can be off by tens of us a second.
        Never on rank 0 (settled from the start: its clock is the reference)."""
        sync = self._clock_sync
        if sync is None or self._closed or self._clock_settled:
            return
        while not self._closed and time.monotonic() < self._clock_deadline:
            if sync.wait_rounds(CLOCK_SETTLED_ROUNDS, 0.05):
                self._clock_settled = True
                return
        if not self._closed:
            log_once(
                "clock_unsettled",
                "tf_otel: clock sync with rank 0 has not settled; "
                "exporting with the offsets known so far",
            )
            self._clock_settled = True

    def _step_attributes(self, handle: StepHandle, model: Any) -> Dict[str, Any]:
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

    def _export_step(self, handle: StepHandle) -> None:
        from opentelemetry.trace import (
            NonRecordingSpan,
            SpanContext,
            Status,
            StatusCode,
            TraceFlags,
            set_span_in_context,
        )

        model = clock.current_model()
        start = model.to_reference(handle.start_ns)
        end = max(start, model.to_reference(handle.end_ns))
        root = SpanContext(
            trace_id=handle.trace_id,
            span_id=step_root_span_id(self.job_id, handle.key, handle.step),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        attributes = self._step_attributes(handle, model)
        if self._gpu is not None:  # the step's GPU summary from the sampler's ring, no NVML call
            with fail_open("gpu_metrics.step_summary"):
                attributes.update(
                    self._gpu.step_summary(self.topology.local_rank, handle.start_ns, handle.end_ns)
                )
        injected = clock.test_clock()
        if injected is not None:  # TF_OTEL_TEST_CLOCK (tests only): the error we should undo
            attributes[ATTR_TEST_CLOCK_ERROR] = injected.error_at_local(handle.start_ns)
        if self._ids is not None:  # the id the step context announced at step begin
            self._ids.prime(
                handle.trace_id,
                step_rank_span_id(self.job_id, handle.key, handle.step, self.topology.rank),
            )
        span = self._tracer.start_span(
            f"rank {self.topology.rank} {handle.name}",
            context=set_span_in_context(NonRecordingSpan(root)),
            start_time=start,
            attributes=attributes,
        )
        if handle.error:
            span.set_status(Status(StatusCode.ERROR, handle.error))
        span.end(end_time=end)
        self._remember(handle.key, handle.step, (span.get_span_context(), start, end))
        if self._metrics is not None:  # exemplars point at this rank's step span
            with fail_open("step_metrics.record"):
                self._metrics.record_step(handle, span.get_span_context())
        records = list(handle.records)
        for produce in handle.deferred:
            with fail_open("export.deferred"):
                records.extend(produce() or ())
        self._export_records(handle.step, records, span.get_span_context(), start, end)
        self._record_collective_wait(handle.key, handle.step, records, span.get_span_context())
        if self._aggregator is not None:
            self._aggregator.add(self.topology.rank, handle.key, handle.step, start, end)
        elif self._client is not None:
            self._client.report(handle.key, handle.step, start, end)

    def _remember(self, key: str, step: int, value: Any) -> None:
        self._steps[(key, step)] = value
        while len(self._steps) > _STEP_CACHE:
            self._steps.pop(next(iter(self._steps)))

    def _export_late(self, key: str, step: int, records: List[record.Record]) -> None:
        known = self._steps.get((key, step))
        if known is None:
            count("records_orphaned")
            return
        self._export_records(step, records, *known)
        self._record_collective_wait(key, step, records, known[0])

    def _record_collective_wait(
        self, key: str, step: int, records: List[record.Record], step_ctx: Any
    ) -> None:
        if self._metrics is not None and records:
            with fail_open("step_metrics.record"):
                self._metrics.record_collective_wait(key, step, records, step_ctx)

    def _export_records(
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
            ctx = self._spans.finished(rec.name, parent_ctx, start, end, attributes)
            done[rec.record_id] = (ctx, start, end)
            return done[rec.record_id]

        for rec in records:
            emit(rec)

    def _emit_root(
        self,
        key: str,
        step: int,
        start_ns: int,
        end_ns: int,
        ranks: int,
        reported: Optional[tuple] = None,
    ) -> None:
        """The step's root over every rank; ``reported``: the ranks heard from when some rank
        never reported the step (killed mid-step, or later than the wait) -> marked partial."""
        from opentelemetry.context import Context
        from opentelemetry.trace import Link

        if self._ids is None:
            return
        links = []
        if self._job_span is not None and self._job_span.get_span_context().is_valid:
            links.append(Link(self._job_span.get_span_context()))
        self._ids.prime(
            step_trace_id(self.job_id, key, step), step_root_span_id(self.job_id, key, step)
        )
        span = self._tracer.start_span(
            f"{key} step {step}",
            context=Context(),
            links=links,
            start_time=start_ns,
            attributes={
                record.ATTR_CATEGORY: record.STEP_ROOT,
                record.ATTR_STEP: step,
                record.ATTR_JOB_ID: self.job_id,
                record.ATTR_STEP_RANKS: ranks,
                record.ATTR_WORLD_SIZE: self.topology.world_size,
                record.ATTR_STEP_WORLD_SIZE: self.topology.step_world_size,
            },
        )
        if reported is not None:
            span.set_attribute("tf_otel.step.partial", True)
            span.set_attribute("tf_otel.step.ranks_reported", list(reported))
        span.end(end_time=end_ns)
