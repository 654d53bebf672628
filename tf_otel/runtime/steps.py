"""Step traces, the training thread's side: step numbers and ids shared by all ranks, sampling,
and the queue to the export thread (runtime/exporter.py builds every span).

The training thread only calls ``begin_step`` / ``end_step`` (a counter, a hash and a sampler
call; for unsampled steps nothing else but, with a MeterProvider, one append for the step
histograms, metrics/step_metrics.py) and ``add_records``. The first step starts the rank's
services (cluster/services.py) and the export thread. See docs/ARCHITECTURE.md.

Usage::

    pipeline = get_pipeline()  # tf_otel.runtime.lifecycle
    step = pipeline.begin_step("keras_train", "keras.train_function", record.KERAS_TRAIN)
    ...  # the step runs
    pipeline.end_step(step)
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Tuple

from tf_otel import clock, record
from tf_otel.cluster.baseline import LiveBaseline
from tf_otel.cluster.exit_deadline import Deadline
from tf_otel.cluster.messages import Handlers, Outgoing
from tf_otel.cluster.services import start_services
from tf_otel.cluster.stall import StepTracker, stack_of
from tf_otel.cluster.stall_record import frame_lines
from tf_otel.cluster.step_collectives import StepCollectives
from tf_otel.cluster.verdicts import LiveVerdicts
from tf_otel.cluster.world import WorldChange, WorldHistory
from tf_otel.config import Settings
from tf_otel.health import count, counters, fail_open, log_once, logger
from tf_otel.job.topology import Topology
from tf_otel.otel.ids import PrimedIdGenerator, fast_root_decision, step_trace_id
from tf_otel.runtime.exporter import StepExporter
from tf_otel.step_handle import StepHandle

_IN_FLIGHT_EXPORTED = 64  # (key, step) of in-flight step spans already exported, kept


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
        self.trace_scope = topology.trace_scope  # what step ids hash (job id, attempt)
        self._tracer_provider = tracer_provider
        with fail_open("resource"):  # on the tracer and the logger provider (OTLP logs)
            from tf_otel.otel.sdk import merge_topology_resource

            merge_topology_resource(topology, tracer_provider)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with fail_open("health_metrics"):
            from tf_otel.metrics import health_metrics

            health_metrics.register(_metrics_resource(topology), step_queue_depth=self._queue.qsize)
        self._metrics: Any = None  # step histograms (metrics.step_metrics); None: no metrics
        with fail_open("step_metrics"):
            from tf_otel.metrics.step_metrics import StepMetrics

            self._metrics = StepMetrics.create(topology.rank)
        self._tracer = trace.get_tracer("tf_otel", __version__, tracer_provider=tracer_provider)
        self._sampler = getattr(self._tracer, "sampler", None)
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
        self.handlers = Handlers()  # extension messages between ranks (cluster.messages)
        self.tracer_provider = tracer_provider  # None: the global one
        # steps in flight and last completed (cluster.stall); rank 0 keeps recent durations
        self.tracker = StepTracker(durations=topology.is_reference and settings.stall)
        self.collectives = StepCollectives()  # what a stall record says the waiting ranks wait in
        self._in_flight_exported: Dict[tuple, None] = {}
        self._in_flight_lock = threading.Lock()
        self._stall_watch: Any = None
        if settings.stall:  # before the coordinator link exists: no question goes unanswered
            with fail_open("stall.register"):
                from tf_otel.cluster import stall

                stall.register(self)
        self._counters: Dict[str, Any] = {}  # step key -> itertools.count
        self._resumed: Dict[str, Any] = {}  # where a resumed run resumed (resume_at)
        self._started = False
        self._closed = False
        self._start_lock = threading.Lock()
        # the export thread's side: spans, roots, the services started with the first step
        self.exporter = StepExporter(topology, self._tracer, self._ids, self._metrics, self._queue)
        self._worker = threading.Thread(
            target=self.exporter.run, name="tf_otel-export", daemon=True
        )

    @property
    def started(self) -> bool:
        """True once a step has begun (the services and the export thread run)."""
        return self._started

    def adopt(self, topology: Topology) -> bool:
        """Take another identity (the cluster the program gave its tf.distribute.Server,
        runtime/lifecycle.learn_cluster) while no step has begun: nothing that carries the
        identity exists before the first step (services start there, resources are merged
        again here). False, and nothing changes, once a step has begun."""
        with self._start_lock:
            if self._started:
                return False
            self.topology = topology
            self.job_id = topology.job_id
            self.trace_scope = topology.trace_scope
            self.exporter.topology = topology
            self.exporter.clock_settled = topology.is_reference
            if self._metrics is not None:
                self._metrics.rank = topology.rank
            with fail_open("resource"):
                from tf_otel.otel.sdk import merge_topology_resource, sdk_meter_provider

                merge_topology_resource(topology, self._tracer_provider)
                from tf_otel.metrics import health_metrics

                health_metrics.merge_resource(sdk_meter_provider(), _metrics_resource(topology))
            return True

    # -- a world that changes while the job runs (Horovod Elastic, cluster/world.py) --------

    def next_steps(self) -> Dict[str, int]:
        """The number the next step of each key counted so far will have."""
        found = {}
        for key, counter in list(self._counters.items()):
            text = repr(counter)  # "count(24)": reading a count without taking a number
            if text.startswith("count(") and text[6:-1].isdigit():
                found[key] = int(text[6:-1])
        return found

    def change_world(self, rank: int, world_size: int) -> Optional[WorldChange]:
        """Horovod re-initialised with another world (an elastic reset, between two steps on
        every rank; ``rank``: Horovod's for this process now): the steps from the next one of
        each key are the new world's. Rank 0's coordinator waits for its ranks only, its roots
        carry its size, the first root of the new world and the job span carry a record of the
        change. The process keeps the rank it began with (its link to rank 0, its resource and
        its spans agree; Horovod renumbers survivors when a rank other than the last leaves):
        said once where Horovod's differs. None where the world did not change."""
        old = self.topology
        if rank != old.rank:
            log_once(
                "world_renumbered",
                "tf_otel: Horovod renumbered this process rank %d (it was rank %d): its spans "
                'keep rank %d%s (docs/guides/RELIABILITY.md, "Elastic Horovod")',
                rank,
                old.rank,
                old.rank,
                ", and no step roots come from it (rank 0's services stay with the process "
                "that began the job)"
                if rank == 0
                else "",
            )
        if world_size == old.world_size:
            return None
        new = replace(old, world_size=world_size, stepping_ranks=0)
        aggregator = self.exporter.services.aggregator
        left: List[int] = []
        joined: List[int] = []
        if world_size < old.world_size:
            # the ranks whose connection ended, where they account for the change (Horovod
            # renumbers the survivors 0..n-1); else the top ones
            gone = sorted(
                r
                for r in (aggregator.finished_ranks() if aggregator is not None else ())
                if 0 < r < old.world_size
            )
            wanted = old.world_size - world_size
            left = gone if len(gone) == wanted else list(range(world_size, old.world_size))
        else:
            joined = list(range(old.world_size, world_size))
        hosts: Dict[int, str] = {}
        if aggregator is not None:
            for moved in left + joined:
                host = aggregator.host_of(moved)
                if host:
                    hosts[moved] = host
        history = self.exporter.world or WorldHistory(old.step_world_size)
        change = history.change(new.step_world_size, self.next_steps(), left, joined, hosts)
        self.topology = self.exporter.topology = new
        self.exporter.world = history
        if aggregator is not None:
            aggregator.history = history
            aggregator.resize(new.step_world_size, left)
        if new.is_reference:
            logger.info("tf_otel: %s", change.text())
            job_span = self.exporter.services.job_span
            if job_span is not None:
                with fail_open("world.job_span"):
                    job_span.add_event(record.WORLD_CHANGE, change.attributes())
        return change

    def flush_now(self, timeout_s: float) -> None:
        """Export what this rank holds now, waiting up to ``timeout_s``: its queued steps become
        spans, the span processors write them (the span file at least). Before an elastic
        reset, which may end this process (a worker the driver removes is aborted by Horovod's
        own init, no exit handler runs)."""
        if not self._started or self._closed:
            return
        deadline = time.monotonic() + timeout_s
        self.exporter.wake()
        while self._queue.qsize() and time.monotonic() < deadline:
            time.sleep(0.01)
        with fail_open("flush.provider"):
            from opentelemetry import trace

            from tf_otel.otel.sdk import bounded_flush

            provider = self._tracer_provider or trace.get_tracer_provider()
            bounded_flush(provider, max(0.0, deadline - time.monotonic()))

    # -- a run resumed from a checkpoint (instrument/keras.py: BackupAndRestore) ------------

    def resume_at(self, key: str, step: int, attributes: Dict[str, Any]) -> bool:
        """Number ``key``'s steps from ``step`` (the program's restored counter says where it
        resumed) and put ``attributes`` on the job span; only while this process has counted
        no step of ``key`` (False then: its own count goes on, never repeating a number)."""
        with self._start_lock:
            if key in self._counters or step < 0:
                return False
            self._counters[key] = itertools.count(step)
            self._resumed = dict(attributes)
        if self._started:
            self._mark_job_resumed()
        return True

    def _mark_job_resumed(self) -> None:
        job_span = self.exporter.services.job_span
        if job_span is not None and self._resumed:
            with fail_open("resume.job_span"):
                job_span.set_attributes(self._resumed)

    # -- training-thread side -------------------------------------------------------------

    def begin_step(self, key: str, name: str, kind: str, **attributes: Any) -> StepHandle:
        if not self._started:
            self._start()
        counter = self._counters.get(key)
        if counter is None:  # setdefault is atomic: closure threads (TF2 PS) may race here
            counter = self._counters.setdefault(key, itertools.count())
        step = next(counter)
        trace_id = step_trace_id(self.trace_scope, key, step)
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
        if not handle.end_ns:  # run_step stamps it before the step's hooks run
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
        """Records of a step produced off its step hooks (e.g. rank 0's parsed timeline), which
        may come before the step ended on this rank: they then wait for its export."""
        if records and not self._closed:
            if self._queue.qsize() >= self.settings.max_queue:  # bounded like end_step's
                count("records_dropped", len(records))
                return
            self._queue.put((key, step, records))

    # -- cross-rank extension messages (cluster.messages; handlers in self.handlers) --

    def send_to_reference(self, message: Outgoing) -> None:
        """From a rank > 0: queue an extension message for rank 0 (dropped if unconnected)."""
        client = self.exporter.services.client
        if client is not None:
            client.send(message)

    def send_to_rank(self, rank: int, message: Outgoing) -> bool:
        """From rank 0: send an extension message to one rank."""
        aggregator = self.exporter.services.aggregator
        return aggregator is not None and aggregator.send(rank, message)

    def broadcast(self, message: Outgoing) -> int:
        """From rank 0: send an extension message to every connected rank."""
        aggregator = self.exporter.services.aggregator
        return aggregator.broadcast(message) if aggregator is not None else 0

    def connected_ranks(self) -> set:
        """From rank 0: the ranks connected to its coordinator now."""
        aggregator = self.exporter.services.aggregator
        return aggregator.connected_ranks() if aggregator is not None else set()

    # -- steps in flight (cluster.stall; SIGTERM / exit mid-step) ---------------------------

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
                    **self.exporter.step_attributes(handle, clock.current_model()),
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
        """A span in the step's trace under its root (runtime.exporter); its span context."""
        return self.exporter.export_in_step(handle, name, start_ns, end_ns, attributes)

    def sampled_ahead(self, key: str, step: int) -> Optional[Tuple[int, bool]]:
        """(trace id, sampled) that ``begin_step`` will give ``step`` of ``key``, before it
        begins; None where the sampler is not a pure function of the trace id (calling one that
        keeps state, a rate limit, ahead of the step would change its decisions)."""
        if self._sample_fast is None:
            return None
        trace_id = step_trace_id(self.trace_scope, key, step)
        return trace_id, bool(self._sample_fast(trace_id))

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
            if self.topology.is_reference and self.settings.verdicts:
                if self.topology.step_world_size > 1:
                    self.exporter.verdicts = LiveVerdicts()
            if self.topology.is_reference and self.settings.baseline:
                with fail_open("pipeline.baseline"):
                    baseline = LiveBaseline.load(self.settings.baseline)
                    if baseline is not None:
                        baseline.register_gauge()
                        self.exporter.baseline = baseline
            with fail_open("pipeline.start"):
                self.exporter.services = start_services(
                    self.settings,
                    self.topology,
                    self._tracer,
                    self.exporter.emit_root,
                    self.handlers,
                )
            self._worker.start()
            if self._resumed:
                self._mark_job_resumed()
            if self.topology.is_reference and self.settings.stall:
                with fail_open("stall.start"):
                    from tf_otel.cluster import stall

                    self._stall_watch = stall.start_watch(self)

    def wake(self) -> None:
        """Convert what is queued now instead of at the next batch interval."""
        self.exporter.wake()

    def shutdown(
        self, timeout_s: float = 5.0, flush: Optional[Callable[[float], None]] = None
    ) -> None:
        """Export what is queued, then rank 0's last roots, then ``flush(seconds left)`` (the
        exit's span flush: before the link to rank 0, clock and metrics stop, so a link still
        trying a rank 0 that has gone never takes the spans' time), then the other services;
        within ``timeout_s`` in all."""
        if self._closed or not self._started:
            self._closed = self.exporter.closed = True
            return
        self._closed = self.exporter.closed = True
        if self._stall_watch is not None:
            self._stall_watch.stop()
        with fail_open("shutdown.in_flight"):  # SIGTERM / exit in the middle of a step
            self.export_in_flight(reason="exit")
        deadline = Deadline(timeout_s)  # every stage takes what the ones before it left
        self._queue.put(None)
        self.exporter.wake()
        self._worker.join(deadline.left())
        if self._metrics is not None:  # steps that ended while the worker stopped
            with fail_open("step_metrics.drain"):
                self._metrics.drain()
        services = self.exporter.services
        with fail_open("shutdown.roots"):
            services.finish(deadline.left(), self.settings.root_wait_ms / 1000.0)
        if flush is not None:
            flush(deadline.left())
        services.stop(deadline.left())
        if counters:
            logger.debug("tf_otel counters: %s", dict(counters))
