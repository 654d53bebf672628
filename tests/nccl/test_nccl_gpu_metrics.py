"""GPU metrics: absent without a GPU (this machine), and the gauges' content with an NVML
stand-in (the one thing that cannot run here is the GPU + driver behind pynvml)."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pynvml
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tf_otel.pipeline.gpu_metrics import start_gpu_metrics


def _points(reader):
    data = reader.get_metrics_data()
    out = {}
    if data is None:
        return out
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    out[(m.name, p.attributes["gpu.device"])] = (
                        p.value,
                        dict(p.attributes),
                        m.unit,
                    )
    return out


def test_no_gpu_here_means_no_error_no_metrics(caplog):
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    with caplog.at_level(logging.DEBUG, logger="tf_otel.pipeline.gpu_metrics"):
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


def test_gauges_per_device_with_rank_attributes_and_stop():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    nvml = FakeNvml()
    attrs = {"tf_otel.rank": 3, "tf_otel.job.id": "job-7"}
    s = start_gpu_metrics(attrs, interval_s=0.05, meter_provider=provider, nvml=nvml)
    assert s is not None and s.interval_s == 0.1  # clamped to the minimum
    pts = _points(reader)
    assert pts[("gpu.utilization", 0)][0] == 0.37 and pts[("gpu.utilization", 1)][0] == 0.9
    assert pts[("gpu.memory.used", 1)][0] == 2 << 30
    assert pts[("gpu.memory.total", 0)][:3:2] == (80 << 30, "By")
    assert pts[("gpu.power", 0)][0] == 312.5 and ("gpu.power", 1) not in pts
    assert pts[("gpu.temperature", 1)][0] == 56
    assert pts[("gpu.temperature", 0)][1] == {**attrs, "gpu.device": 0}
    assert s.errors >= 1  # the unsupported power reading, counted

    nvml.util[0] = 80  # the background thread picks up new values
    deadline = time.time() + 5
    while time.time() < deadline and _points(reader)[("gpu.utilization", 0)][0] != 0.8:
        time.sleep(0.05)
    assert _points(reader)[("gpu.utilization", 0)][0] == 0.8

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
    from tf_otel.pipeline import gpu_metrics
    from tf_otel.pipeline.steps import Pipeline

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
    assert [s.attributes["gpu.utilization"] for s in steps] == [0.9]  # device 1 of the stand-in
    assert nvml.shutdowns == 1


def test_no_gpu_means_no_gpu_attribute_on_steps():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tf_otel.config import Settings
    from tf_otel.job.topology import Topology
    from tf_otel.pipeline.steps import Pipeline

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    pipeline = Pipeline(Settings(), Topology(job_id="cpu-job"), provider)
    pipeline.end_step(pipeline.begin_step("k", "n", "tf_function"))
    pipeline.shutdown()
    assert pipeline._gpu is None
    assert all("gpu.utilization" not in s.attributes for s in exporter.get_finished_spans())
