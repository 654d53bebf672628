"""tf_otel's own health as OpenTelemetry metrics, on the job's resource (rank, job id, host).

Observable instruments read counters tf_otel keeps anyway, only when the SDK collects: nothing
runs on the training thread. Exported wherever the process's MeterProvider sends metrics
(``OTEL_METRICS_EXPORTER=otlp``); with no MeterProvider nothing is registered.

    tf_otel.spans.ended        {}                                   spans this process ended
    tf_otel.spans.exported     {tf_otel.exporter}                   confirmed by that exporter
    tf_otel.spans.lost         {tf_otel.exporter, tf_otel.cause}    cause: export_failed,
                                                                    queue_full, unconfirmed
    tf_otel.export.failures    {tf_otel.exporter}                   failed export calls
    tf_otel.steps.dropped      {}                                   tf_otel's step queue was full
    tf_otel.queue.depth        {tf_otel.queue}                      steps | spans, now
    tf_otel.clock.uncertainty  {}                                   ns, of the offset to rank 0
    tf_otel.channel.refused    {tf_otel.service}                    unauthenticated connections
    tf_otel.stalls             {}                                   rank 0: stalls it raised
    tf_otel.stalls.active      {}                                   rank 0: 1 while one lasts
    tf_otel.slowdowns          {}                                   rank 0: slowdowns it raised
    tf_otel.slowdowns.active   {}                                   rank 0: open ones, now

Usage::

    register({"tf_otel.rank": 0, "tf_otel.job.id": "j1"}, step_queue_depth=lambda: 0)
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Mapping

from tf_otel.health import counters
from tf_otel.otel.sdk import sdk_meter_provider

_registered = False


def merge_resource(provider: Any, attributes: Mapping[str, Any]) -> None:
    """The SDK MeterProvider's resource gets the job topology too (as the TracerProvider's)."""
    from opentelemetry.sdk.resources import Resource

    config = getattr(provider, "_sdk_config", None)
    if config is not None and getattr(config, "resource", None) is not None:
        config.resource = config.resource.merge(Resource(dict(attributes)))


def register(resource: Mapping[str, Any], step_queue_depth: Callable[[], int] = lambda: 0) -> bool:
    """Register the health instruments once; False when no MeterProvider is set."""
    global _registered
    if _registered:
        return True
    provider = sdk_meter_provider()
    if provider is None:
        return False
    from opentelemetry.metrics import CallbackOptions, Observation

    from tf_otel import clock
    from tf_otel.otel import delivery
    from tf_otel.version import __version__

    merge_resource(provider, resource)
    meter = provider.get_meter("tf_otel", __version__)

    def observe(values: Iterable[tuple]) -> list:
        return [Observation(value, dict(attrs)) for value, attrs in values]

    def ended(_: CallbackOptions) -> list:
        return observe([(delivery.ended_spans(), {})])

    def exported(_: CallbackOptions) -> list:
        return observe((x.exported, {"tf_otel.exporter": x.label}) for x in delivery.losses())

    def lost(_: CallbackOptions) -> list:
        rows = []
        for x in delivery.losses():
            for cause, value in (("export_failed", x.failed), ("queue_full", x.queue_full)):
                rows.append((value, {"tf_otel.exporter": x.label, "tf_otel.cause": cause}))
        return observe(rows)

    def failures(_: CallbackOptions) -> list:
        return observe(
            (w.failed_calls, {"tf_otel.exporter": w.label}) for _, w in delivery._watched
        )

    def steps_dropped(_: CallbackOptions) -> list:
        return observe([(counters.get("steps_dropped", 0), {})])

    def depth(_: CallbackOptions) -> list:
        queued = sum(x.queued for x in delivery.losses())
        return observe(
            [(step_queue_depth(), {"tf_otel.queue": "steps"}), (queued, {"tf_otel.queue": "spans"})]
        )

    def uncertainty(_: CallbackOptions) -> list:
        return observe([(clock.current_model().uncertainty_ns, {})])

    def refused(_: CallbackOptions) -> list:
        rows: Dict[str, int] = {
            "coordinator": counters.get("coordinator_refused", 0),
            "clock": counters.get("clock_refused", 0),
        }
        return observe((v, {"tf_otel.service": k}) for k, v in rows.items())

    meter.create_observable_counter("tf_otel.spans.ended", [ended], unit="{span}")
    meter.create_observable_counter("tf_otel.spans.exported", [exported], unit="{span}")
    meter.create_observable_counter("tf_otel.spans.lost", [lost], unit="{span}")
    meter.create_observable_counter("tf_otel.export.failures", [failures], unit="{call}")
    meter.create_observable_counter("tf_otel.steps.dropped", [steps_dropped], unit="{step}")
    meter.create_observable_gauge("tf_otel.queue.depth", [depth], unit="{item}")
    meter.create_observable_gauge("tf_otel.clock.uncertainty", [uncertainty], unit="ns")
    meter.create_observable_counter("tf_otel.channel.refused", [refused], unit="{connection}")

    def raised(name: str) -> Callable[[CallbackOptions], list]:
        return lambda _: observe([(counters.get(name, 0), {})])

    def active(began: str, ended: str) -> Callable[[CallbackOptions], list]:
        return lambda _: observe([(max(0, counters.get(began, 0) - counters.get(ended, 0)), {})])

    # rank 0's live verdicts (cluster/stall.py, cluster/verdicts.py): what alerting rules read
    meter.create_observable_counter("tf_otel.stalls", [raised("stalls_begun")], unit="{stall}")
    meter.create_observable_gauge(
        "tf_otel.stalls.active", [active("stalls_begun", "stalls_resolved")], unit="{stall}"
    )
    meter.create_observable_counter(
        "tf_otel.slowdowns", [raised("slowdowns_began")], unit="{slowdown}"
    )
    meter.create_observable_gauge(
        "tf_otel.slowdowns.active",
        [active("slowdowns_began", "slowdowns_ended")],
        unit="{slowdown}",
    )
    _registered = True
    return True


def flush(timeout_s: float) -> None:
    """At exit: one last collection, so the final counts (the losses above all) go out."""
    provider = sdk_meter_provider()
    if provider is not None and hasattr(provider, "force_flush"):
        provider.force_flush(int(timeout_s * 1000))
