"""A rank's services, started with its first step: rank 0's coordinator (step roots, messages
between ranks) and the job span; on other ranks the link to rank 0; clock sync, GPU and system
metrics everywhere.

Usage::

    services = start_services(settings, topology, tracer, emit_root, handlers)
    services.report(rank, key, step, start_ns, end_ns)  # a step's extent -> rank 0's root
    services.finish(timeout_s=5.0, root_wait_s=2.0)   # rank 0's last roots, the job span
    services.stop(timeout_s=5.0)                      # after the span flush: the rest

Each service fails open on its own: one that cannot start leaves its field None and the others
run.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from tf_otel import clock, record
from tf_otel.clock.sync import SETTLE_MAX_S
from tf_otel.cluster.coordinator import StepAggregator
from tf_otel.cluster.coordinator_client import CoordinatorClient
from tf_otel.cluster.exit_deadline import Deadline
from tf_otel.cluster.messages import Handlers
from tf_otel.cluster.relay_route import close_link, coordinator_link, lead_directly
from tf_otel.config import Settings
from tf_otel.health import fail_open, log_once
from tf_otel.job.topology import Topology
from tf_otel.otel.ids import PrimedIdGenerator, job_span_ids


@dataclass
class Services:
    """What ``start_services`` started (None: not on this rank, or it could not start)."""

    aggregator: Optional[StepAggregator] = None  # rank 0: every rank's extents -> step roots
    client: Optional[CoordinatorClient] = None  # ranks > 0: the link to rank 0 (or its relay)
    relay_election: Any = None  # rank 0: its host's relay election, held ("direct")
    job_span: Any = None  # rank 0: the job's span under the launcher's TRACEPARENT
    clock_sync: Any = None  # tf_otel.clock.sync: offsets to rank 0's clock
    clock_deadline: float = 0.0  # monotonic: exports stop waiting for the clock to settle
    gpu: Any = None  # GPU metrics sampler (None without NVML / GPU)
    system: Any = None  # host / process metrics (metrics.system_metrics)

    def report(
        self,
        rank: int,
        key: str,
        step: int,
        start_ns: int,
        end_ns: int,
        wait_ns: Optional[int] = None,
    ) -> None:
        """This rank's extent of a step (reference time) and its input wait (None: not
        measured) towards rank 0's step root and verdict."""
        if self.aggregator is not None:
            self.aggregator.add(rank, key, step, start_ns, end_ns, wait_ns)
        elif self.client is not None:
            self.client.report(key, step, start_ns, end_ns, wait_ns)

    def finish(self, timeout_s: float, root_wait_s: float) -> None:
        """What still makes spans, before the exit's span flush: rank 0's last step roots
        (waiting up to ``root_wait_s`` of ``timeout_s`` for the ranks still reporting) and the
        job span."""
        if self.aggregator is not None:
            self.aggregator.flush(min(timeout_s, root_wait_s))
            self.aggregator.close()
        if self.relay_election is not None:
            self.relay_election.release()
        if self.job_span is not None:
            self.job_span.end(end_time=clock.now_ns())
            self.job_span = None

    def stop(self, timeout_s: float) -> None:
        """The other services, after the span flush, within ``timeout_s`` in all: the link to
        rank 0 (and a leader's relay), clock sync, GPU and system metrics."""
        deadline = Deadline(timeout_s)
        if self.client is not None:
            close_link(self.client, deadline.left(2.0))
        if self.clock_sync is not None:
            with fail_open("clock.stop"):
                self.clock_sync.stop(deadline.left())
        if self.gpu is not None:
            with fail_open("gpu_metrics.stop"):
                self.gpu.stop()
        if self.system is not None:
            with fail_open("system_metrics.stop"):
                self.system.stop(deadline.left(2.0))


def start_services(
    settings: Settings,
    topology: Topology,
    tracer: Any,
    emit_root: Callable[..., None],
    handlers: Handlers,
) -> Services:
    services = Services()
    address = settings.coordinator or topology.coordinator_address()
    if topology.is_reference:
        with fail_open("job_span"):
            services.job_span = job_span(tracer, topology)
        services.aggregator = StepAggregator(
            topology.step_world_size, settings.root_wait_ms / 1000.0, emit_root, handlers=handlers
        )
        if topology.world_size > 1 and address is not None:
            bind_host = "127.0.0.1" if address[0] in ("127.0.0.1", "localhost") else "0.0.0.0"
            services.aggregator.serve((bind_host, address[1]))
            with fail_open("relay.direct"):  # its host's ranks talk to it directly
                services.relay_election = lead_directly(
                    settings, topology, services.aggregator.secret
                )
    elif address is not None:
        services.client = coordinator_link(settings, topology, address, handlers)
    else:
        log_once(
            "no_coordinator",
            "tf_otel: rank 0's host is unknown (multi-host launch); set "
            "TF_OTEL_COORDINATOR=host:port so step roots cover every rank",
        )
    metric_attributes = {
        record.ATTR_RANK: topology.rank,
        record.ATTR_JOB_ID: topology.job_id,
        "host.name": topology.host,
    }
    if settings.gpu_metrics_interval_s > 0:
        with fail_open("gpu_metrics.start"):
            from tf_otel.metrics.gpu_metrics import start_gpu_metrics

            services.gpu = start_gpu_metrics(
                dict(metric_attributes), interval_s=settings.gpu_metrics_interval_s
            )
    with fail_open("system_metrics.start"):  # host/process semconv metrics, off-thread
        from tf_otel.metrics import system_metrics

        services.system = system_metrics.start(
            {**metric_attributes, record.ATTR_WORLD_SIZE: topology.world_size},
            interval_s=settings.system_metrics_interval_s,
        )
    with fail_open("clock.start"):
        from tf_otel.clock import sync

        services.clock_sync = sync.start_sync(topology, settings, share_host=True)
        services.clock_deadline = time.monotonic() + SETTLE_MAX_S
    return services


def job_span(tracer: Any, topology: Topology) -> Any:
    """Rank 0's span of the whole job, child of the launcher's TRACEPARENT where one is set."""
    from opentelemetry.propagate import extract

    carrier = {}
    for env_name, header in (("TRACEPARENT", "traceparent"), ("TRACESTATE", "tracestate")):
        if os.environ.get(env_name):
            carrier[header] = os.environ[env_name]
    parent = extract(carrier) if carrier else None
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    attributes = {
        record.ATTR_CATEGORY: record.JOB,
        record.ATTR_JOB_ID: topology.job_id,
        record.ATTR_WORLD_SIZE: topology.world_size,
        record.ATTR_LAUNCHER: topology.launcher,
    }
    links = []
    if topology.attempt:  # ids the next attempt knows; a link to the one before where known
        from opentelemetry.trace import Link, SpanContext, TraceFlags

        attributes[record.ATTR_JOB_ATTEMPT] = topology.attempt
        ids = getattr(tracer, "id_generator", None)
        if isinstance(ids, PrimedIdGenerator):
            ids.prime(*job_span_ids(topology.trace_scope))
        previous = topology.previous_attempt
        if previous is not None:
            attributes[record.ATTR_JOB_PREVIOUS_ATTEMPT] = previous
            if parent is None:  # under a TRACEPARENT the earlier attempt's trace is unknown
                before = replace(topology, attempt=previous).trace_scope
                trace_id, span_id = job_span_ids(before)
                context = SpanContext(trace_id, span_id, True, TraceFlags(TraceFlags.SAMPLED))
                links.append(Link(context))
    return tracer.start_span(
        f"training job {script}",
        context=parent,
        links=links,
        start_time=clock.now_ns(),
        attributes=attributes,
    )
