"""Horovod collectives timed by every rank itself, in its graph: the default source of collective
spans (the runtime side; ``sources.horovod_stamp_records`` turns stamps into records).

Usage::

    from tf_otel.instrument.horovod.stamps import hook
    hook.register()   # step hook, its message handlers (hvd.a, hvd.l), its exit hand-over

Why not Horovod's timeline (measured, docs/guides/HOROVOD.md): with ``HOROVOD_TIMELINE`` set,
rank 0's timeline writer thread spins (``sched_yield``) from ``hvd.init()`` on, a core's worth
of CPU even while no file is written, and writes every event with two ``lseek`` and one
``write``; only rank 0 writes, and on response-cache hits it has no per-rank arrivals.

Three parts: ``stamp_graph`` puts the stamps into a detail twin's trace (the program's own
trace gets none) and reads them back; this module picks the detail steps (``TF_OTEL_HOROVOD_EVERY``
from the step trace id: the same steps on every rank) and collects each one's stamps on the
training thread; ``arrival_exchange`` shares them between the ranks on the export thread and
emits this rank's collective / wait / transfer records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional

from tf_otel import record
from tf_otel.cluster import messages
from tf_otel.health import count
from tf_otel.instrument import detail_twin, detail_twin_gate
from tf_otel.instrument._patching import (
    Error,
    HookOrder,
    StepCall,
    StepHook,
    add_step_hook,
    is_active,
)
from tf_otel.instrument.horovod import graph_stamps
from tf_otel.instrument.horovod.arrival_exchange import ArrivalExchange, step_world_size
from tf_otel.instrument.horovod.collective_source import OFF, STAMPS, choice
from tf_otel.instrument.horovod.stamp_graph import OPS, TENSORFLOW, Found, StampGraph
from tf_otel.runtime.lifecycle import current_pipeline
from tf_otel.runtime.steps import Pipeline
from tf_otel.step_handle import StepHandle

__all__ = ["OPS", "TENSORFLOW", "collector", "exchange", "graph", "hook"]

_EXIT_WAIT_S = 3.0
_STALE_NS = 100_000  # float64 seconds round to ~0.2 µs; older stamps ran before this step

PARTS_DENSE_EVERY = 10  # detail on 1 step in fewer than this: no wait / transfer children


def parts_wanted(setting: Optional[bool], every: int) -> bool:
    """Wait / transfer children (TF_OTEL_HOROVOD_PARTS); unset: only where detail is sparse."""
    return setting if setting is not None else every >= PARTS_DENSE_EVERY


def fused_wanted(setting: Optional[bool], every: int) -> bool:
    """One span per group of tensors that completed together (TF_OTEL_HOROVOD_FUSED); unset:
    only where detail is dense (span volume is what dense detail costs, docs/guides/HOROVOD.md)."""
    return setting if setting is not None else 0 < every < PARTS_DENSE_EVERY


def _collective_world() -> int:
    """Horovod's size once it is up, else the job's stepping ranks (tf.distribute)."""
    if choice.basics is not None:
        return int(choice.basics.size())
    return step_world_size()


graph = StampGraph()
exchange = ArrivalExchange()


class StampCollector:
    """The detail-step policy and a detail step's stamps, on the training thread."""

    @property
    def every(self) -> int:
        """TF_OTEL_HOROVOD_EVERY, shared with the timeline source (``choice.every``)."""
        return choice.every

    @every.setter
    def every(self, value: int) -> None:
        choice.every = value

    def wanted(self, handle: StepHandle) -> bool:
        return choice.wanted(handle)

    def begin(self, handle: StepHandle) -> Optional[int]:
        """A sampled step starts: when it is a collective-detail step, its start (wall clock,
        ns) and collect; else None."""
        if not self.wanted(handle):
            return None
        graph.eager = []
        return time.time_ns()

    def end(
        self,
        handle: StepHandle,
        started: Optional[int],
        fetched: Optional[List[Found]] = None,
    ) -> None:
        """A sampled step ended; ``started``: what ``begin`` gave; ``fetched``: its TF1 graph
        stamps (graph_stamps), if any."""
        if started is None:
            graph.eager = None
            if self.every > 0:
                graph.prepare_reader()
            return
        eager, graph.eager = graph.eager or [], None
        found: List[Found] = list(eager)
        candidates: List[Found] = list(fetched or [])
        if fetched is None:
            values = graph.read()
            for (_, stamps, group), (t0, t1) in zip(graph.slots(len(values)), values):
                t0_ns, t1_ns = int(t0 * 1e9), int(t1 * 1e9)
                candidates.extend((s, t0_ns, t1_ns, group) for s in stamps)
        found.extend(c for c in candidates if c[1] >= started - _STALE_NS)
        key, step = handle.key, handle.step
        exchange.hold(key, step, found)
        # on the export thread, after this step's span exists (records of it may follow)
        handle.deferred.append(lambda: exchange.share_pending(key, step))


collector = StampCollector()


@dataclass
class _DetailStep:
    """A collective-detail step from its start to its end."""

    # wall clock, ns: stamps older than this belong to earlier steps; None: the step ran the
    # program's own function after all (detail_twin.ran_own_function)
    started: Optional[int]


def _deferred(handle: StepHandle) -> None:
    """A picked step ran the program's own function: its span says the twin is preparing."""
    handle.attributes[record.ATTR_DETAIL_TWIN] = record.DETAIL_TWIN_PREPARING
    count("twin_detail_deferred")


class StampsHook(StepHook[_DetailStep]):
    """The stamps' step hook: collects on detail steps, decides whether graphs get stamps."""

    order = HookOrder.HOROVOD

    def __init__(self) -> None:
        self._finished = False

    def on_step_start(self, handle: StepHandle, call: StepCall) -> Optional[_DetailStep]:
        detail_twin.note_step(handle.key, handle.step)  # rank 0 picks the first twin step past it
        if call.kind == record.SESSION_RUN:  # its runs are prepared for detail (graph_stamps)
            graph_stamps.step_begins(detail=False)
        if not handle.sampled or choice.mode == OFF or self._finished:
            return None
        pipeline = current_pipeline()
        if pipeline is None or (pipeline.topology.world_size < 2 and choice.replicas < 2):
            return None
        if choice.current() != STAMPS:
            return None
        if exchange.backend is None:
            exchange.backend = choice.backend()
        if collector.wanted(handle) and not detail_twin.ready_for(handle.key, handle.step):
            # picked, but its twin is not prepared on every rank yet: the program's own graph
            _deferred(handle)
            return None
        started = collector.begin(handle)
        if started is None:
            return None
        detail = _DetailStep(started)
        # this step runs the twin of its function, with the stamps
        detail_twin.want(True, every_step=collector.every == 1)
        if call.kind == record.SESSION_RUN:  # a TF1 step's runs fetch their stamps too
            graph_stamps.step_begins(detail=True, every_step=collector.every == 1)
        return detail

    def on_step_end(
        self, handle: StepHandle, call: StepCall, error: Error, kept: Optional[_DetailStep]
    ) -> None:
        fetched, unprepared = None, False
        if call.kind == record.SESSION_RUN:
            fetched, unprepared = graph_stamps.step_ends()
        if kept is not None and (detail_twin.ran_own_function() or unprepared):
            # its function's first call ran the program's own, or its TF1 runs are still being
            # prepared: no stamps to collect
            _deferred(handle)
            kept.started = None
        detail_twin.want(False)
        if handle.sampled and choice.current() == STAMPS:
            collector.end(handle, kept.started if kept is not None else None, fetched)

    def stamping(self) -> bool:
        """Graph construction inside a detail twin's trace (instrument/detail_twin.py): time Horovod
        ops? The program's own traces never get timing ops."""
        return detail_twin.tracing() and self.twins_wanted()

    def twins_wanted(self) -> bool:
        """Do this process's steps need detail twins (default source, more than one rank)?"""
        if choice.current() != STAMPS or self._finished or not is_active():
            return False
        if collector.every <= 0:
            return False  # TF_OTEL_HOROVOD_EVERY=0 (default): no timing ops in the graph
        try:
            return _collective_world() > 1 or choice.replicas > 1
        except Exception:  # noqa: BLE001
            return False

    def finish(self) -> None:
        """At exit / SIGTERM: wait (bounded) for this rank's detail steps' records."""
        if self._finished or choice.current() != STAMPS:
            return
        self._finished = True
        pipeline = current_pipeline()
        if pipeline is not None:
            exchange.finish(pipeline.topology.rank == 0, _EXIT_WAIT_S)

    def _handle_messages(self, pipeline: Pipeline) -> None:
        pipeline.handlers.on_reference(messages.HVD_ARRIVALS, exchange.on_arrivals)
        pipeline.handlers.on_rank(messages.HVD_LAST, exchange.on_last)

    def register(self, every: int, parts: Optional[bool], fused: Optional[bool] = None) -> None:
        """The step hook, its message handlers and its exit hand-over (once per process)."""
        from tf_otel.runtime.lifecycle import before_shutdown, with_pipeline

        collector.every = every
        exchange.parts = parts_wanted(parts, every)
        exchange.fused = fused_wanted(fused, every)
        graph.enabled = self.stamping
        graph.graph_enabled = self.twins_wanted
        detail_twin.wanted_by(self.twins_wanted)
        detail_twin.after_prepare(graph.build_reader)
        add_step_hook(self)
        with_pipeline(self._handle_messages)
        with_pipeline(detail_twin_gate.attach)
        before_shutdown(self.finish)


hook = StampsHook()
