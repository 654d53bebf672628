"""GPU metrics: absent without a GPU (this machine), and the hw.gpu.* instruments' content with
an NVML stand-in (the one thing that cannot run here is the GPU + driver behind pynvml); the
per-step summary on step spans and the analysis' low_gpu_utilization finding from it."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pynvml
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tf_otel.metrics.gpu_metrics import start_gpu_metrics


def _points(reader):
    data = reader.get_metrics_data()
    out = {}
    if data is None:
        return out
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    out[(m.name, p.attributes["hw.id"])] = (
                        p.value,
                        dict(p.attributes),
                        m.unit,
                    )
    return out


def test_no_gpu_here_means_no_error_no_metrics(caplog):
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    with caplog.at_level(logging.DEBUG, logger="tf_otel.metrics.gpu_metrics"):
        sampler = start_gpu_metrics({"tf_otel.rank": 0}, meter_provider=provider)
    assert sampler is None  # real pynvml, no NVML library / driver on this machine
    assert _points(reader) == {}
    assert len([r for r in caplog.records if "NVML unavailable" in r.message]) == 1
    assert all(r.levelno == logging.DEBUG for r in caplog.records)
    provider.shutdown()


class FakeNvml:
    """pynvml's call surface for two GPUs; GPU 1 has no power sensor (NotSupported)."""

    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def __init__(self):
        self.shutdowns = 0
        self.util = [37, 90]

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.util[h], memory=5)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=80 << 30, used=(h + 1) << 30, free=0)

    def nvmlDeviceGetPowerUsage(self, h):
        if h == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 312_500  # mW

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 55 + h

    def nvmlDeviceGetName(self, h):
        return f"Stand-in {h}"


def test_gauges_per_device_with_rank_attributes_and_stop():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    nvml = FakeNvml()
    attrs = {"tf_otel.rank": 3, "tf_otel.job.id": "job-7"}
    s = start_gpu_metrics(attrs, interval_s=0.05, meter_provider=provider, nvml=nvml)
    assert s is not None and s.interval_s == 0.1  # clamped to the minimum
    pts = _points(reader)
    util = pts[("hw.gpu.utilization", "gpu0")]
    assert util[0] == 0.37 and pts[("hw.gpu.utilization", "gpu1")][0] == 0.9
    assert util[1:] == (
        {
            **attrs,
            "hw.id": "gpu0",
            "hw.type": "gpu",
            "hw.vendor": "NVIDIA",
            "hw.name": "Stand-in 0",
            "hw.gpu.task": "general",
        },
        "1",
    )
    assert pts[("hw.gpu.memory.usage", "gpu1")][:3:2] == (2 << 30, "By")
    assert pts[("hw.gpu.memory.limit", "gpu0")][:3:2] == (80 << 30, "By")
    assert pts[("hw.gpu.memory.utilization", "gpu1")][:3:2] == (2 / 80, "1")
    assert pts[("hw.power", "gpu0")][:3:2] == (312.5, "W")
    assert pts[("hw.power", "gpu0")][1]["hw.type"] == "gpu"
    assert not [k for k in pts if k[0] == "hw.power" and k[1] == "gpu1"]  # no sensor: skipped
    temperature = pts[("hw.temperature", "gpu1_temperature")]
    assert temperature[0] == 56 and temperature[2] == "Cel"
    assert temperature[1]["hw.parent"] == "gpu1" and "hw.type" not in temperature[1]
    assert s.errors >= 1  # the unsupported power reading, counted
    data = reader.get_metrics_data()
    kinds = {
        m.name: type(m.data).__name__
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    # the convention's instrument types: memory as UpDownCounters (non-monotonic sums)
    assert kinds["hw.gpu.memory.usage"] == kinds["hw.gpu.memory.limit"] == "Sum"
    assert kinds["hw.gpu.utilization"] == kinds["hw.power"] == "Gauge"

    nvml.util[0] = 80  # the background thread picks up new values
    deadline = time.time() + 5
    while time.time() < deadline and _points(reader)[("hw.gpu.utilization", "gpu0")][0] != 0.8:
        time.sleep(0.05)
    assert _points(reader)[("hw.gpu.utilization", "gpu0")][0] == 0.8

    s.stop()
    assert not s._thread.is_alive() and nvml.shutdowns == 1
    assert _points(reader) == {}
    provider.shutdown()


def test_nvml_without_devices_is_absent_too():
    nvml = FakeNvml()
    nvml.nvmlDeviceGetCount = lambda: 0
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    assert start_gpu_metrics(meter_provider=provider, nvml=nvml) is None
    assert nvml.shutdowns == 1 and _points(reader) == {}
    provider.shutdown()


def test_step_spans_carry_the_ranks_gpu_utilisation(monkeypatch):
    """The pipeline starts GPU metrics at its first step and joins the latest utilisation of
    the rank's GPU (its local rank) onto each step span, where `tf-otel analyze` reads it."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tf_otel.config import Settings
    from tf_otel.job.topology import Topology
    from tf_otel.metrics import gpu_metrics
    from tf_otel.runtime.steps import Pipeline

    nvml = FakeNvml()
    real_start = gpu_metrics.start_gpu_metrics
    monkeypatch.setattr(
        gpu_metrics,
        "start_gpu_metrics",
        lambda attributes, interval_s: real_start(
            attributes, interval_s, meter_provider=MeterProvider(), nvml=nvml
        ),
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    topology = Topology(rank=1, world_size=1, local_rank=1, job_id="gpu-job")
    pipeline = Pipeline(Settings(gpu_metrics_interval_s=0.1), topology, provider)
    pipeline.end_step(pipeline.begin_step("k", "n", "tf_function"))
    pipeline.shutdown()
    steps = [s for s in exporter.get_finished_spans() if s.attributes["tf_otel.category"] == "step"]
    assert [s.attributes["hw.gpu.utilization"] for s in steps] == [0.9]  # device 1 of the stand-in
    assert [s.attributes["hw.gpu.memory.usage"] for s in steps] == [2 << 30]
    assert not [s for s in steps if "gpu.utilization" in s.attributes]  # the old name is gone
    assert nvml.shutdowns == 1


def test_no_gpu_means_no_gpu_attribute_on_steps():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tf_otel.config import Settings
    from tf_otel.job.topology import Topology
    from tf_otel.runtime.steps import Pipeline

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    pipeline = Pipeline(Settings(), Topology(job_id="cpu-job"), provider)
    pipeline.end_step(pipeline.begin_step("k", "n", "tf_function"))
    pipeline.shutdown()
    assert pipeline.exporter.services.gpu is None
    assert not [s for s in exporter.get_finished_spans() if any("gpu" in k for k in s.attributes)]


def test_step_summary_averages_the_samples_taken_during_the_step():
    """The ring of timestamped samples: the mean utilisation of the samples inside the step,
    memory from the sample nearest its end; a step between samples gets the nearest one."""
    nvml = FakeNvml()
    s = start_gpu_metrics(interval_s=3600, meter_provider=MeterProvider(), nvml=nvml)
    assert s is not None
    for t, util, used_gib in ((100, 10, 1), (200, 30, 2), (300, 50, 3), (400, 70, 4)):
        nvml.util[0] = util
        nvml.nvmlDeviceGetMemoryInfo = lambda h, u=used_gib: SimpleNamespace(
            total=80 << 30, used=u << 30, free=0
        )
        s.sample_once(now_ns=t)
    summary = s.step_summary(0, 150, 320)  # samples at 200 and 300
    assert summary["hw.gpu.utilization"] == 0.4
    assert summary["hw.gpu.memory.usage"] == 3 << 30
    assert s.step_summary(0, 210, 240) == {  # no sample inside: the one nearest the end
        "hw.gpu.utilization": 0.3,
        "hw.gpu.memory.usage": 2 << 30,
    }
    assert s.step_summary(5, 0, 500) == {}  # a device NVML does not have
    s.stop()


def _run_steps(monkeypatch, util_percent: int, steps: int = 12):
    """A real Pipeline on one rank whose GPU (the stand-in's device 0) reads ``util_percent``;
    each step outlasts a sampling interval; the spans it exported, as the analysis reads them."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tf_otel.analysis.analyze import analyze_spans
    from tf_otel.analysis.model import Span
    from tf_otel.config import Settings
    from tf_otel.job.topology import Topology
    from tf_otel.metrics import gpu_metrics
    from tf_otel.runtime.steps import Pipeline

    nvml = FakeNvml()
    nvml.util = [util_percent, util_percent]
    real_start = gpu_metrics.start_gpu_metrics
    monkeypatch.setattr(
        gpu_metrics,
        "start_gpu_metrics",
        lambda attributes, interval_s: real_start(
            attributes, interval_s, meter_provider=MeterProvider(), nvml=nvml
        ),
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    topology = Topology(rank=0, world_size=1, local_rank=0, job_id=f"gpu-{util_percent}")
    pipeline = Pipeline(Settings(gpu_metrics_interval_s=0.1), topology, provider)
    for _ in range(steps):
        handle = pipeline.begin_step("train", "train", "tf_function")
        time.sleep(0.15)
        pipeline.end_step(handle)
    pipeline.shutdown()
    finished = exporter.get_finished_spans()
    spans = [
        Span(
            f"{s.context.trace_id:032x}",
            f"{s.context.span_id:016x}",
            f"{s.parent.span_id:016x}" if s.parent else None,
            s.name,
            s.start_time,
            s.end_time,
            dict(s.attributes),
            dict(s.resource.attributes),
        )
        for s in finished
    ]
    spans.sort(key=lambda span: span.trace_id)
    step_spans = [s for s in finished if s.attributes["tf_otel.category"] == "step"]
    return step_spans, analyze_spans(spans, source="test")


def test_low_gpu_utilisation_from_the_step_spans_alone(monkeypatch):
    """Injected: NVML reads 10 % all run. Each step span says 0.1 and the analysis of the spans
    (nothing else) raises low_gpu_utilization for rank 0."""
    steps, result = _run_steps(monkeypatch, 10)
    assert len(steps) == 12
    assert [s.attributes["hw.gpu.utilization"] for s in steps] == [pytest.approx(0.1)] * 12
    assert {s.attributes["hw.gpu.memory.usage"] for s in steps} == {1 << 30}
    (finding,) = [f for f in result.findings if f.rule == "low_gpu_utilization"]
    assert finding.evidence["by_rank"]["0"]["p95_percent"] == 10.0
    # the report's per-rank GPU section reads the same step means, and one rule fires
    assert result.gpu_utilization == {0: [pytest.approx(10.0)] * 12}
    assert [f.rule for f in result.findings].count("low_gpu_utilization") == 1


def test_busy_gpu_raises_no_low_utilisation(monkeypatch):
    """Control: the same run at 90 % carries 0.9 and raises nothing about the GPU."""
    steps, result = _run_steps(monkeypatch, 90)
    assert [s.attributes["hw.gpu.utilization"] for s in steps] == [pytest.approx(0.9)] * 12
    assert "low_gpu_utilization" not in [f.rule for f in result.findings]
