"""Host and process metrics per rank with the OpenTelemetry semantic-convention names
(``system.cpu.utilization``, ``system.memory.usage``, ``system.network.io``, ``system.disk.io``,
``process.cpu.utilization``, ``process.memory.usage``...), read by the well-kept
``opentelemetry-instrumentation-system-metrics`` (psutil) rather than hand-written readers.

Started by the tracing pipeline when the process has an SDK MeterProvider
(``OTEL_METRICS_EXPORTER=otlp``): a MeterProvider of its own, on the same exporter and with the
global provider's resource plus the rank / job attributes, read every
``TF_OTEL_SYSTEM_METRICS_INTERVAL_S`` seconds by the SDK's reader thread: nothing runs on the
training thread. No GPU metrics here (``hw.gpu.*`` come from NVML, tf_otel/metrics/gpu_metrics.py).

    handle = start({"tf_otel.rank": 0, "tf_otel.job.id": "j"}, interval_s=10.0)
    handle.stop()
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from tf_otel.health import count, run_bounded

# semconv names worth the export; the instrumentor's default set also has swap, gc, threads...
METRICS = {
    "system.cpu.utilization": ["idle", "user", "system", "iowait"],
    "system.memory.usage": ["used", "free", "cached"],
    "system.memory.utilization": ["used"],
    "system.network.io": ["transmit", "receive"],
    "system.disk.io": ["read", "write"],
    "system.disk.operations": ["read", "write"],
    "process.cpu.utilization": ["user", "system"],
    "process.memory.usage": None,
    "process.memory.virtual": None,
    "process.open_file_descriptor.count": None,
    "process.thread.count": None,
}


class SystemMetrics:
    def __init__(self, provider: Any, instrumentor: Any) -> None:
        self.provider = provider
        self.instrumentor = instrumentor

    def stop(self, timeout_s: float = 2.0) -> None:
        try:
            self.instrumentor.uninstrument()
        finally:
            # on a daemon thread: a reader mid-export to a wedged collector ignores the timeout
            run_bounded(
                "tf_otel-system-metrics-stop",
                timeout_s,
                self.provider.shutdown,
                timeout_millis=timeout_s * 1000,
            )


def start(attributes: Mapping[str, Any], interval_s: float) -> Optional[SystemMetrics]:
    """None (and nothing started) without an SDK MeterProvider with a periodic reader."""
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    global_provider = metrics.get_meter_provider()
    if interval_s <= 0 or not isinstance(global_provider, MeterProvider):
        return None
    exporter = None
    # SDK internals (1.45: MeterProvider._metric_readers); absent -> nothing started
    for reader in getattr(global_provider, "_metric_readers", ()):
        exporter = getattr(reader, "_exporter", None)
        if exporter is not None:
            break
    if exporter is None:
        return None
    from opentelemetry.instrumentation.system_metrics import SystemMetricsInstrumentor

    resource = global_provider._sdk_config.resource.merge(_resource(attributes))
    provider = MeterProvider(
        resource=resource,
        metric_readers=[
            PeriodicExportingMetricReader(
                _shared(exporter), export_interval_millis=interval_s * 1000
            )
        ],
        # the pipeline stops it within bounds; the SDK's own exit would wait on a retrying
        # exporter for up to 30 s
        shutdown_on_exit=False,
    )
    instrumentor = SystemMetricsInstrumentor(config=dict(METRICS))
    instrumentor.instrument(meter_provider=provider)
    return SystemMetrics(provider, instrumentor)


def _shared(exporter: Any) -> Any:
    """The global provider's exporter, which our reader must not shut down at exit (the
    global provider still flushes through it)."""
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    class Shared(MetricExporter):
        def __init__(self) -> None:
            super().__init__(
                preferred_temporality=getattr(exporter, "_preferred_temporality", None),
                preferred_aggregation=getattr(exporter, "_preferred_aggregation", None),
            )

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
            # the global provider may shut the exporter down (at exit) while this reader's
            # last export still retries: a failed export, not a traceback in the user's log
            if getattr(exporter, "_shutdown", False):
                return MetricExportResult.FAILURE
            try:
                return exporter.export(metrics_data, timeout_millis=timeout_millis)
            except Exception:
                count("system_metrics_export_errors")
                return MetricExportResult.FAILURE

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return exporter.force_flush(timeout_millis)

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            pass

    return Shared()


def _resource(attributes: Mapping[str, Any]) -> Any:
    from opentelemetry.sdk.resources import Resource

    return Resource(dict(attributes))
