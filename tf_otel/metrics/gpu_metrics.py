"""Per-GPU NVML readings as OpenTelemetry hardware metrics (``hw.gpu.*``, via pynvml), and the
per-step summary the step spans carry.

Usage::

    from tf_otel.metrics.gpu_metrics import start_gpu_metrics
    sampler = start_gpu_metrics({"tf_otel.rank": 0, "tf_otel.job.id": "j1"}, interval_s=10)
    summary = sampler.step_summary(device=0, start_ns=t0, end_ns=t1)  # export thread
    if sampler: sampler.stop()

A daemon thread samples NVML every ``interval_s`` into a cache and a bounded ring, so neither
the training thread nor the exporter ever calls NVML. Instruments follow the OpenTelemetry
hardware semantic conventions (docs/hardware/gpu.md, common.md, temperature.md):

    hw.gpu.utilization         Gauge          1    nvmlDeviceGetUtilizationRates().gpu / 100,
                                                   hw.gpu.task=general
    hw.gpu.memory.usage        UpDownCounter  By   nvmlDeviceGetMemoryInfo().used
    hw.gpu.memory.limit        UpDownCounter  By   nvmlDeviceGetMemoryInfo().total
    hw.gpu.memory.utilization  Gauge          1    used / total
    hw.power                   Gauge          W    nvmlDeviceGetPowerUsage() (mW) / 1000
    hw.temperature             Gauge          Cel  nvmlDeviceGetTemperature(GPU sensor)

Attributes: the given ones + ``hw.id`` (``gpu<NVML index>``), ``hw.type``, ``hw.vendor``,
``hw.name``; ``hw.temperature`` is its sensor's (``hw.parent=gpu<i>``). ``hw.gpu.io`` is not
emitted: NVML gives PCIe throughput only as a rate, not the byte counter the convention asks
for. No pynvml, driver or GPU: ``start_gpu_metrics`` returns None and registers nothing; a
failing reading is skipped for that device and counted.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterable, List, Mapping, Optional, Tuple

from tf_otel import clock

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 10.0
MIN_INTERVAL_S = 0.1
RING_SAMPLES = 256  # per-step summaries look back this far (25.6 s at the minimum interval)

UTILIZATION = "hw.gpu.utilization"
MEMORY_USAGE = "hw.gpu.memory.usage"
MEMORY_LIMIT = "hw.gpu.memory.limit"
MEMORY_UTILIZATION = "hw.gpu.memory.utilization"
POWER = "hw.power"
TEMPERATURE = "hw.temperature"

Sample = Dict[int, Dict[str, float]]  # device -> metric -> value


class GpuSampler:
    """Samples NVML on a background thread; exposes the latest values as observable
    instruments and the recent ones as per-step summaries."""

    def __init__(
        self, nvml: Any, handles: List[Any], attributes: Mapping[str, Any], interval_s: float
    ) -> None:
        self._nvml = nvml
        self._handles = handles
        self._attrs = dict(attributes)
        self.interval_s = max(MIN_INTERVAL_S, float(interval_s))
        self._lock = threading.Lock()
        self._latest: Sample = {}  # bounded: one entry per device
        self._ring: Deque[Tuple[int, Sample]] = deque(maxlen=RING_SAMPLES)  # (local ns, values)
        self.errors = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._instruments: List[Any] = []
        self._device_attrs = [self._describe(i, h) for i, h in enumerate(handles)]

    def _describe(self, index: int, device: Any) -> Dict[str, Any]:
        attrs: Dict[str, Any] = {"hw.id": f"gpu{index}", "hw.type": "gpu", "hw.vendor": "NVIDIA"}
        try:
            name = self._nvml.nvmlDeviceGetName(device)
            attrs["hw.name"] = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # older pynvml, or a board that does not say: the name is optional
            pass
        return attrs

    # ---- sampling ----
    def _read(self, h: Any) -> Dict[str, float]:
        n = self._nvml
        out: Dict[str, float] = {}
        readers: Dict[str, Callable[[], float]] = {
            UTILIZATION: lambda: n.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
            MEMORY_USAGE: lambda: float(n.nvmlDeviceGetMemoryInfo(h).used),
            MEMORY_LIMIT: lambda: float(n.nvmlDeviceGetMemoryInfo(h).total),
            POWER: lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0,  # mW -> W
            TEMPERATURE: lambda: float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
        }
        for name, read in readers.items():
            try:
                out[name] = read()
            except Exception:  # NVMLError_NotSupported etc.: skip this reading
                self.errors += 1
        if out.get(MEMORY_LIMIT):
            if MEMORY_USAGE in out:
                out[MEMORY_UTILIZATION] = out[MEMORY_USAGE] / out[MEMORY_LIMIT]
        return out

    def latest(self, device: int, metric: str) -> Optional[float]:
        """The last sampled value of ``metric`` for ``device`` (None before the first sample)."""
        return self._latest.get(device, {}).get(metric)

    def sample_once(self, now_ns: Optional[int] = None) -> None:
        """One reading of every device; ``now_ns`` (local clock) defaults to now (tests pass it)."""
        values = {i: self._read(h) for i, h in enumerate(self._handles)}
        t = clock.now_ns() if now_ns is None else now_ns
        with self._lock:
            self._latest = values
            self._ring.append((t, values))
        self.samples += 1

    def step_summary(self, device: int, start_ns: int, end_ns: int) -> Dict[str, float]:
        """What the step span carries for a step [start_ns, end_ns] (local clock):
        ``hw.gpu.utilization``, the mean of the samples taken during the step (NVML's own
        reading already averages its last 1/6 to 1 s), else the sample nearest the step's
        end; ``hw.gpu.memory.usage``, the sample nearest the step's end. {} with no sample."""
        with self._lock:
            ring = list(self._ring)
        readings = [(t, v[device]) for t, v in ring if device in v]
        if not readings:
            return {}
        out: Dict[str, float] = {}
        during = [
            v[UTILIZATION] for t, v in readings if start_ns <= t <= end_ns and UTILIZATION in v
        ]
        nearest = min(readings, key=lambda tv: abs(tv[0] - end_ns))[1]
        if during:
            out[UTILIZATION] = sum(during) / len(during)
        elif UTILIZATION in nearest:
            out[UTILIZATION] = nearest[UTILIZATION]
        if MEMORY_USAGE in nearest:
            out[MEMORY_USAGE] = nearest[MEMORY_USAGE]
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample_once()
            except Exception:  # never let the sampler die loudly
                self.errors += 1
                log.debug("gpu_metrics: sampling failed", exc_info=True)

    # ---- OTel ----
    def _observe(self, metric: str) -> Callable[[Any], Iterable[Any]]:
        from opentelemetry.metrics import Observation

        def callback(_options: Any) -> Iterable[Any]:
            with self._lock:
                snap = {d: v.get(metric) for d, v in self._latest.items()}
            return [
                Observation(v, {**self._attrs, **self._point_attrs(metric, d)})
                for d, v in sorted(snap.items())
                if v is not None
            ]

        return callback

    def _point_attrs(self, metric: str, device: int) -> Dict[str, Any]:
        attrs = self._device_attrs[device]
        if metric == UTILIZATION:
            return {**attrs, "hw.gpu.task": "general"}
        if metric == TEMPERATURE:  # the GPU's sensor, a component of its own
            sensor = {k: v for k, v in attrs.items() if k != "hw.type"}
            return {**sensor, "hw.id": f"{attrs['hw.id']}_temperature", "hw.parent": attrs["hw.id"]}
        return attrs

    def register(self, meter: Any) -> None:
        gauge, updown = meter.create_observable_gauge, meter.create_observable_up_down_counter
        specs = (
            (gauge, UTILIZATION, "1", "Fraction of time a kernel was running on the GPU"),
            (updown, MEMORY_USAGE, "By", "GPU memory used"),
            (updown, MEMORY_LIMIT, "By", "Size of the GPU memory"),
            (gauge, MEMORY_UTILIZATION, "1", "Fraction of GPU memory used"),
            (gauge, POWER, "W", "Instantaneous power consumed by the GPU"),
            (gauge, TEMPERATURE, "Cel", "GPU core temperature"),
        )
        for create, name, unit, desc in specs:
            self._instruments.append(
                create(name, callbacks=[self._observe(name)], unit=unit, description=desc)
            )

    def start(self) -> None:
        self.sample_once()  # values exist before the first collection
        self._thread = threading.Thread(target=self._run, name="tf_otel-gpu-metrics", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._lock:
            self._latest = {}  # gauges report nothing once stopped
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass


def _load_nvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


def start_gpu_metrics(
    attributes: Optional[Mapping[str, Any]] = None,
    interval_s: float = DEFAULT_INTERVAL_S,
    meter_provider: Any = None,
    nvml: Any = None,
) -> Optional[GpuSampler]:
    """Start sampling every GPU NVML sees; None (silently) when there is none to sample.

    attributes: added to every observation (e.g. tf_otel.rank, tf_otel.job.id).
    meter_provider: default the global one. nvml: the pynvml module (for tests).
    """
    try:
        n = nvml if nvml is not None else _load_nvml()
        n.nvmlInit()
    except Exception as e:  # ImportError, NVMLError_LibraryNotFound / DriverNotLoaded ...
        log.debug("gpu_metrics: NVML unavailable (%s); no GPU metrics", e)
        return None
    try:
        count = int(n.nvmlDeviceGetCount())
        handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    except Exception as e:
        log.debug("gpu_metrics: cannot enumerate GPUs (%s); no GPU metrics", e)
        _shutdown(n)
        return None
    if not handles:
        log.debug("gpu_metrics: NVML sees no GPU; no GPU metrics")
        _shutdown(n)
        return None
    if meter_provider is None:
        from opentelemetry import metrics

        meter_provider = metrics.get_meter_provider()
    sampler = GpuSampler(n, handles, attributes or {}, interval_s)
    sampler.register(meter_provider.get_meter("tf_otel.nccl.gpu_metrics"))  # scope name kept
    sampler.start()
    return sampler


def _shutdown(n: Any) -> None:
    try:
        n.nvmlShutdown()
    except Exception:
        pass
