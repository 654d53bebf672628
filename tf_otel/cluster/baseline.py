"""Rank 0's live comparison with a reference run (``TF_OTEL_BASELINE=<analyze report.json>``).

Usage (the exporter on rank 0, from the coordinator's thread as each step's root goes out)::

    baseline = LiveBaseline.load("reference.json")   # None: unusable (said once, named)
    found = baseline.observe(key, step, duration_ns, lateness_by_rank_ns)
    if found is not None: found.slower, found.ratio, found.attributes()

The reference is a saved ``tf-otel analyze --format json`` report: its ``profile`` (the steady
steps' median step time, robust sigma and count; each rank's median lateness). Rank 0 keeps the
last WINDOW step times of each step key after its first WARMUP_STEPS (tracing, compiling) and,
every WINDOW steps, compares their median with the reference's as ``tf-otel diff`` does
(analysis/compare/diff.py): slower (or faster) when the medians differ by more than max(3 standard
errors of their difference, MIN_SHARE of the reference median), the standard error from each
side's robust sigma and count. A slower window is a span event on that step's root
(``tf_otel.baseline.slower``, with the window's median, the reference's, the ratio, the
threshold and the rank whose median lateness grew most over the reference's, where one did by
more than the threshold); every window sets the ``tf_otel.step.baseline_ratio`` gauge (with its
verdict as an attribute), which a Prometheus alert reads. Memory: WINDOW durations and
lateness values a key, MAX_KEYS keys. Only the keys named like the reference's main step
function are compared (any key where the reference names none).
"""

from __future__ import annotations

import json
import math
import statistics
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, Iterable, Mapping, Optional

from tf_otel.health import log_once

WARMUP_STEPS = 2
WINDOW = 16
MAX_KEYS = 8
MIN_SHARE = 0.02  # a window within 2 % of the reference median is no change
Z = 3.0
MEDIAN_SE = 1.2533
MAD_TO_SIGMA = 1.4826
EVENT = "tf_otel.baseline.slower"
GAUGE = "tf_otel.step.baseline_ratio"


@dataclass(frozen=True)
class WindowVerdict:
    key: str
    step: int  # the window's last step
    median_ns: float
    reference_ns: float
    threshold_ns: float
    verdict: str  # slower, faster, no change
    rank: Optional[int] = None  # the rank whose lateness grew most beyond the threshold
    rank_growth_ns: float = 0.0

    @property
    def slower(self) -> bool:
        return self.verdict == "slower"

    @property
    def ratio(self) -> float:
        return self.median_ns / self.reference_ns if self.reference_ns else 1.0

    def attributes(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "tf_otel.baseline.median_ms": round(self.median_ns / 1e6, 3),
            "tf_otel.baseline.reference_ms": round(self.reference_ns / 1e6, 3),
            "tf_otel.baseline.ratio": round(self.ratio, 4),
            "tf_otel.baseline.threshold_ms": round(self.threshold_ns / 1e6, 3),
            "tf_otel.baseline.window": WINDOW,
        }
        if self.rank is not None:
            out["tf_otel.baseline.rank"] = self.rank
            out["tf_otel.baseline.rank_lateness_growth_ms"] = round(self.rank_growth_ns / 1e6, 3)
        return out


class LiveBaseline:
    def __init__(self, profile: Mapping[str, Any]) -> None:
        step = profile["step_ms"]
        self.reference_ns = float(step["median"]) * 1e6
        self.reference_se_ns = MEDIAN_SE * float(step["sigma"] or 0) * 1e6 / math.sqrt(step["n"])
        self.series: Optional[str] = profile.get("series")
        self.lateness_ns = {
            int(rank): float(values["lateness_ms"]) * 1e6
            for rank, values in profile.get("by_rank", {}).items()
            if values.get("lateness_ms") is not None
        }
        self._keys: OrderedDict[str, Deque[tuple]] = OrderedDict()
        self._seen: Dict[str, int] = {}
        self._lock = threading.Lock()
        self.latest: Optional[WindowVerdict] = None  # what the gauge reports

    @classmethod
    def load(cls, path: str) -> Optional[LiveBaseline]:
        """The reference at ``path``, or None with one log line naming it and why."""
        try:
            with open(path, encoding="utf-8") as handle:
                document = json.load(handle)
            profile = document["profile"]
            if not profile["step_ms"]["n"] or profile["step_ms"]["median"] is None:
                raise ValueError("it has no steady steps")
            return cls(profile)
        except (OSError, ValueError, KeyError, TypeError) as error:
            why = (
                "no profile (a report written before tf-otel diff)"
                if isinstance(error, KeyError)
                else str(error)
            )
            log_once(
                "baseline_unusable",
                f"tf_otel: TF_OTEL_BASELINE={path!r} is not a usable tf-otel analyze JSON "
                f"report ({why}); no live comparison",
            )
            return None

    def _compared(self, key: str) -> bool:
        if not self.series:
            return True
        name = key.split(":", 1)[-1] or key
        return name == self.series or name.startswith(self.series.rstrip("…"))

    def observe(
        self,
        key: str,
        step: int,
        duration_ns: int,
        lateness_ns: Optional[Mapping[int, int]] = None,
    ) -> Optional[WindowVerdict]:
        """One step's root went out; the window's verdict every WINDOW steps, else None."""
        if not self._compared(key):
            return None
        with self._lock:
            seen = self._seen[key] = self._seen.get(key, 0) + 1
            if seen <= WARMUP_STEPS:
                return None
            window = self._keys.get(key)
            if window is None:
                if len(self._keys) >= MAX_KEYS:
                    old, _ = self._keys.popitem(last=False)
                    self._seen.pop(old, None)
                window = self._keys[key] = deque(maxlen=WINDOW)
            window.append((duration_ns, dict(lateness_ns or {})))
            if (seen - WARMUP_STEPS) % WINDOW or len(window) < WINDOW:
                return None
            found = self._judge(key, step, list(window))
            self.latest = found
            return found

    def _judge(self, key: str, step: int, window: list) -> WindowVerdict:
        durations = [float(d) for d, _ in window]
        median = statistics.median(durations)
        mad = statistics.median(abs(d - median) for d in durations)
        se = MEDIAN_SE * MAD_TO_SIGMA * mad / math.sqrt(len(durations))
        threshold = max(Z * math.hypot(se, self.reference_se_ns), MIN_SHARE * self.reference_ns)
        delta = median - self.reference_ns
        verdict = "no change"
        if abs(delta) > threshold:
            verdict = "slower" if delta > 0 else "faster"
        rank, growth = self._rank(window, threshold) if verdict == "slower" else (None, 0.0)
        return WindowVerdict(key, step, median, self.reference_ns, threshold, verdict, rank, growth)

    def _rank(self, window: list, threshold: float) -> tuple:
        """The rank whose median lateness over the window grew most over the reference's."""
        late: Dict[int, list] = {}
        for _, by_rank in window:
            for rank, value in by_rank.items():
                late.setdefault(rank, []).append(value)
        best, growth = None, 0.0
        for rank, values in late.items():
            grew = statistics.median(values) - self.lateness_ns.get(rank, 0.0)
            if grew > threshold and grew > growth:
                best, growth = rank, grew
        return best, growth

    def observations(self) -> Iterable[tuple]:
        """(ratio, attributes) for the gauge: the latest window's, none before the first."""
        found = self.latest
        if found is None:
            return []
        return [(found.ratio, {"tf_otel.step.key": found.key, "tf_otel.verdict": found.verdict})]

    def register_gauge(self) -> bool:
        """The ``tf_otel.step.baseline_ratio`` gauge on the SDK's MeterProvider (False: none)."""
        from tf_otel.otel.sdk import sdk_meter_provider

        provider = sdk_meter_provider()
        if provider is None:
            return False
        from opentelemetry.metrics import CallbackOptions, Observation

        from tf_otel.version import __version__

        def ratio(_: CallbackOptions) -> list:
            return [Observation(value, dict(attrs)) for value, attrs in self.observations()]

        provider.get_meter("tf_otel", __version__).create_observable_gauge(
            GAUGE,
            [ratio],
            unit="1",
            description="The latest window's median step time over the reference run's "
            "(TF_OTEL_BASELINE), with its verdict",
        )
        return True
