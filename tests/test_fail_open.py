"""Instrumentation fails open: errors inside tf_otel are logged once, counted, and training
goes on with its own result or its own exception."""

from __future__ import annotations

import logging
import time
import types

import pytest

from tf_otel.health import counters
from tf_otel.instrument import _patching, check_tensorflow_version


class _BrokenHook(_patching.StepHook):
    def on_step_start(self, handle, call):
        raise RuntimeError("hook exploded")

    def on_step_end(self, handle, call, error, kept):
        raise RuntimeError("hook exploded again")


@pytest.fixture
def broken_hook():
    hook = _BrokenHook()
    _patching.add_step_hook(hook)
    was_active = _patching.is_active()
    _patching.activate()
    yield hook
    _patching.remove_step_hook(hook)
    if not was_active:
        _patching._active = False


def test_a_failing_hook_neither_stops_nor_changes_the_step(broken_hook, caplog):
    with caplog.at_level(logging.WARNING, logger="tf_otel"):
        results = [
            _patching.run_step(lambda x: x * 2, (21,), {}, "k", "n", "tf_function")
            for _ in range(3)
        ]
    assert results == [42, 42, 42]
    logged = [r.getMessage() for r in caplog.records if "hook exploded" in r.getMessage()]
    assert len(logged) == 2  # once for start, once for end: not once per step
    assert counters["error:_BrokenHook.on_step_start"] >= 3


def test_the_training_functions_own_exception_passes_through(broken_hook):
    def step():
        raise ValueError("the user's bug")

    with pytest.raises(ValueError, match="the user's bug"):
        _patching.run_step(step, (), {}, "k", "n", "tf_function")
    assert _patching.state.depth == 0


def test_old_tensorflow_is_reported_once(caplog):
    with caplog.at_level(logging.WARNING, logger="tf_otel"):
        assert not check_tensorflow_version(types.SimpleNamespace(__version__="2.9.1"))
        assert not check_tensorflow_version(types.SimpleNamespace(__version__="2.9.1"))
        assert check_tensorflow_version(types.SimpleNamespace(__version__="2.21.0"))
    assert sum("TensorFlow 2.9.1" in r.getMessage() for r in caplog.records) == 1


class _SlowHook(_patching.StepHook):
    """Takes 50 ms after the step, and notes the end each step's hooks saw."""

    def __init__(self) -> None:
        self.seen = []

    def on_step_start(self, handle, call):
        return None

    def on_step_end(self, handle, call, error, kept):
        self.seen.append(handle.end_ns)
        time.sleep(0.05)


def test_the_step_ends_before_its_hooks_run(monkeypatch):
    """A hook's own time (here 50 ms) is not the step's, and every hook reads the end the
    step's span gets (the input share was computed on another window than its span's)."""
    first, second = _SlowHook(), _SlowHook()
    handles = []
    real = _patching._get_pipeline()
    end_step = real.end_step

    def recorded(handle, error=None):
        handles.append(handle)
        end_step(handle, error)

    monkeypatch.setattr(real, "end_step", recorded)
    was_active = _patching.is_active()
    _patching.add_step_hook(first)
    _patching.add_step_hook(second)
    _patching.activate()
    try:
        _patching.run_step(lambda: None, (), {}, "k", "n", "tf_function")
    finally:
        _patching.remove_step_hook(first)
        _patching.remove_step_hook(second)
        if not was_active:
            _patching._active = False
    (handle,) = handles
    assert first.seen == second.seen == [handle.end_ns]
    assert handle.end_ns - handle.start_ns < 40_000_000  # the hooks' 100 ms are outside


def _exporter_record(kind: str) -> logging.LogRecord:
    """The OTLP exporter's own retry warning (its format and arguments)."""
    return logging.LogRecord(
        "opentelemetry.exporter.otlp.proto.grpc.exporter", logging.WARNING, __file__, 1,
        "Transient error %s encountered while exporting %s to %s, retrying in %ss.",
        ("StatusCode.UNAVAILABLE", kind, "localhost:4317", 1.1), None,
    )  # fmt: skip


def test_a_failing_export_is_said_once_per_signal_and_names_it():
    """One exporter logger serves spans and metrics: a missing collector is one line for each,
    named for what fails (a run with only a metrics endpoint missing read "span export")."""
    from tf_otel.otel.sdk import _ExportFailureFilter

    flt = _ExportFailureFilter()
    kinds = [f"unit-{time.monotonic_ns()}-{kind}" for kind in ("a", "b")]  # fresh log-once keys
    said = []
    for name in kinds:
        for signal in ("metrics", "traces", "metrics", "traces"):
            record = _exporter_record(signal)
            record.name = name
            if flt.filter(record):
                said.append((name, record.getMessage().split(";")[0]))
    assert said == [
        (name, f"tf_otel: {kind} export is failing")
        for name in kinds
        for kind in ("metric", "span")
    ]


def test_system_metrics_export_through_a_closed_exporter_fails_quietly(caplog):
    """The system-metrics reader shares the global provider's exporter; at exit that exporter
    can close while the reader's last export retries (seen: "Exception while exporting metrics
    ... Cannot invoke RPC on closed channel" in a third-party program's log): the export
    fails, counted, and nothing is raised into the SDK's reader thread."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

    from tf_otel.metrics.system_metrics import _shared

    exporter = OTLPMetricExporter(endpoint="127.0.0.1:9", insecure=True, timeout=1)
    shared = _shared(exporter)
    before = counters["system_metrics_export_errors"]
    exporter._channel.close()  # closed under a retrying export, before its shutdown flag
    assert shared.export(MetricsData(resource_metrics=[])) is MetricExportResult.FAILURE
    assert counters["system_metrics_export_errors"] == before + 1
    exporter.shutdown()
    assert shared.export(MetricsData(resource_metrics=[])) is MetricExportResult.FAILURE
