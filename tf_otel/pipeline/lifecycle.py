"""The process's one pipeline and its end: created by the first step, flushed once at exit.

Usage::

    from tf_otel.pipeline.lifecycle import before_shutdown, current_pipeline, get_pipeline

    get_pipeline().begin_step(...)      # creates it from the environment on first use
    current_pipeline()                  # the pipeline if one exists, else None (no side effect)
    with_pipeline(lambda p: p.handlers.on_rank(kind, handler))  # set up once it exists
    before_shutdown(timeline.flush)     # sources that still hold records hand them over first
    shutdown(timeout_s=5.0)             # bounded; safe to call more than once
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional

from tf_otel import config
from tf_otel.health import fail_open, run_bounded
from tf_otel.pipeline.steps import Pipeline

_pipeline: Optional[Pipeline] = None
_pipeline_lock = threading.Lock()
_setups: List[Callable[[Pipeline], None]] = []  # run on the pipeline when it is created
_tracer_provider: Any = None  # instrument(tracer_provider=...): else the global one


def given_tracer_provider() -> Any:
    """The TracerProvider instrument() was given, or None (the global one)."""
    return _tracer_provider


def use_tracer_provider(provider: Any) -> None:
    """The TracerProvider the pipeline will use (before the first step), as the OpenTelemetry
    contrib instrumentations take one; None: the global provider."""
    global _tracer_provider
    _tracer_provider = provider


def get_pipeline() -> Pipeline:
    global _pipeline
    if _pipeline is None:
        with _pipeline_lock:
            if _pipeline is None:
                settings = config.current()
                from tf_otel.job.topology import detect

                pipeline = Pipeline(settings, detect(job_id=settings.job_id), _tracer_provider)
                for setup in _setups:  # before any step: no message can arrive unhandled
                    with fail_open("pipeline.setup"):
                        setup(pipeline)
                _pipeline = pipeline
    return _pipeline


def with_pipeline(setup: Callable[[Pipeline], None]) -> None:
    """Run ``setup(pipeline)`` on this process's pipeline: now if it exists, else when
    ``get_pipeline`` creates it (sources register their message handlers this way, at
    instrument time, without creating the pipeline early)."""
    with _pipeline_lock:
        pipeline = _pipeline
        if pipeline is None:
            _setups.append(setup)
            return
    with fail_open("pipeline.setup"):
        setup(pipeline)


_before_shutdown: List[Any] = []


def current_pipeline() -> Optional[Pipeline]:
    """This process's pipeline, or None before the first step (never creates one)."""
    return _pipeline


def before_shutdown(callback: Any) -> None:
    """Run ``callback()`` at the start of shutdown (exit, SIGTERM), before spans are flushed:
    sources that still hold records (e.g. the Horovod timeline) hand them over there."""
    if callback not in _before_shutdown:
        _before_shutdown.append(callback)


_shutdown_lock = threading.Lock()


_exit_reported = False


def shutdown(timeout_s: Optional[float] = None) -> None:
    """Flush this process's step spans (bounded by timeout_s, default TF_OTEL_EXIT_TIMEOUT_S),
    then say in one line what was lost, if anything. Safe to call more than once."""
    global _exit_reported
    if timeout_s is None:
        timeout_s = config.current().exit_timeout_s
    with _shutdown_lock:
        for callback in list(_before_shutdown):
            with fail_open("shutdown.before"):
                callback()
        pipeline = _pipeline
        if pipeline is not None:
            with fail_open("shutdown"):
                pipeline.shutdown(timeout_s)
        with fail_open("shutdown.provider"):
            from opentelemetry import trace

            from tf_otel.pipeline.sdk import bounded_flush

            bounded_flush(trace.get_tracer_provider(), timeout_s)
        if not _exit_reported:
            _exit_reported = True
            with fail_open("shutdown.report"):
                from tf_otel.pipeline import delivery

                delivery.report_at_exit(timeout_s)
            with fail_open("shutdown.metrics"):  # the final counts, never holding the exit
                from tf_otel.pipeline import health_metrics

                run_bounded(
                    "tf_otel-metrics-flush", min(timeout_s, 2.0), health_metrics.flush, timeout_s
                )
            with fail_open("shutdown.meter_provider"):
                _stop_own_meter_provider(min(timeout_s, 2.0))


def _stop_own_meter_provider(timeout_s: float) -> None:
    """The MeterProvider tf_otel configured ends on a daemon thread joined for a bounded time:
    its own atexit handler would wait up to 30 s on an exporter retrying a missing or hanging
    collector. A provider the program (or opentelemetry-instrument) set up is left to its owner."""
    from tf_otel.pipeline import sdk

    if not sdk.configured_here():
        return
    from opentelemetry import metrics

    provider = metrics.get_meter_provider()
    handler = getattr(provider, "_atexit_handler", None)  # SDK internals (1.45)
    if handler is None or not hasattr(provider, "shutdown"):
        return
    import atexit

    atexit.unregister(handler)
    provider._atexit_handler = None  # type: ignore[attr-defined]
    run_bounded(
        "tf_otel-metrics-stop", timeout_s, provider.shutdown, timeout_millis=timeout_s * 1000
    )
