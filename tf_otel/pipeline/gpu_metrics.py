"""Per-GPU utilisation, memory, power and temperature as OpenTelemetry metrics (via pynvml).

Usage::

    from tf_otel.pipeline.gpu_metrics import start_gpu_metrics
    sampler = start_gpu_metrics({"tf_otel.rank": 0, "tf_otel.job.id": "j1"}, interval_s=10)
    ...
    if sampler: sampler.stop()

A daemon thread samples NVML every ``interval_s`` into a small cache; observable gauges
report the cache when the SDK collects, so neither the training thread nor the exporter ever
calls NVML. Instruments (attributes: ``gpu.device`` + the given ones):

    gpu.utilization   ratio 0..1 of time a kernel ran (nvmlDeviceGetUtilizationRates().gpu)
    gpu.memory.used   By
    gpu.memory.total  By
    gpu.power         W
    gpu.temperature   Cel

No pynvml, no driver or no GPU: ``start_gpu_metrics`` returns None, registers nothing, and
logs one debug line. A failing reading (e.g. power on a GPU without the sensor) is skipped
for that device and counted.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 10.0
MIN_INTERVAL_S = 0.1


class GpuSampler:
    """Samples NVML on a background thread; exposes the latest values as observable gauges."""

    def __init__(
        self, nvml: Any, handles: List[Any], attributes: Mapping[str, Any], interval_s: float
    ) -> None:
        self._nvml = nvml
        self._handles = handles
        self._attrs = dict(attributes)
        self.interval_s = max(MIN_INTERVAL_S, float(interval_s))
        self._lock = threading.Lock()
        self._latest: Dict[int, Dict[str, float]] = {}  # device -> metric -> value (bounded)
        self.errors = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._instruments: List[Any] = []

    # ---- sampling ----
    def _read(self, h: Any) -> Dict[str, float]:
        n = self._nvml
        out: Dict[str, float] = {}
        readers: Dict[str, Callable[[], float]] = {
            "gpu.utilization": lambda: n.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
            "gpu.memory.used": lambda: float(n.nvmlDeviceGetMemoryInfo(h).used),
            "gpu.memory.total": lambda: float(n.nvmlDeviceGetMemoryInfo(h).total),
            "gpu.power": lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0,  # mW -> W
            "gpu.temperature": lambda: float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
        }
        for name, read in readers.items():
            try:
                out[name] = read()
            except Exception:  # NVMLError_NotSupported etc.: skip this reading
                self.errors += 1
        return out

    def latest(self, device: int, metric: str) -> Optional[float]:
        """The last sampled value of ``metric`` for ``device`` (None before the first sample)."""
        return self._latest.get(device, {}).get(metric)

    def sample_once(self) -> None:
        values = {i: self._read(h) for i, h in enumerate(self._handles)}
        with self._lock:
            self._latest = values
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:  # never let the sampler die loudly
                self.errors += 1
                log.debug("gpu_metrics: sampling failed", exc_info=True)
            self._stop.wait(self.interval_s)

    # ---- OTel ----
    def _observe(self, metric: str) -> Callable[[Any], Iterable[Any]]:
        from opentelemetry.metrics import Observation

        def callback(_options: Any) -> Iterable[Any]:
            with self._lock:
                snap = {d: v.get(metric) for d, v in self._latest.items()}
            return [
                Observation(v, {**self._attrs, "gpu.device": d})
                for d, v in sorted(snap.items())
                if v is not None
            ]

        return callback

    def register(self, meter: Any) -> None:
        specs = (
            ("gpu.utilization", "1", "Fraction of time a kernel was running on the GPU"),
            ("gpu.memory.used", "By", "GPU memory in use"),
            ("gpu.memory.total", "By", "GPU memory installed"),
            ("gpu.power", "W", "GPU power draw"),
            ("gpu.temperature", "Cel", "GPU core temperature"),
        )
        for name, unit, desc in specs:
            self._instruments.append(
                meter.create_observable_gauge(
                    name, callbacks=[self._observe(name)], unit=unit, description=desc
                )
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
