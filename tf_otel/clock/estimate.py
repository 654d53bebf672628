"""Pure estimation: ping-pong exchanges -> kept samples -> linear offset + drift model.

One exchange: the client sends at t0 (its clock), the reference receives at t1 and replies at t2
(reference clock), the client receives at t3. Then (reference - local)::

    offset = ((t1 - t0) + (t2 - t3)) / 2        rtt = (t3 - t0) - (t2 - t1)

and the true offset lies within offset +- rtt/2, so the low-RTT exchanges are the good ones:
each round drops the worst 10% by RTT (Intel Trace Collector) and keeps the fastest ones
(Score-P's min-RTT idea), and the model is a weighted least-squares line through the kept samples
of recent rounds (offset + drift), weighted by how close each RTT is to the minimum.

Usage::

    kept = select([Exchange(t0, t1, t2, t3), ...])
    result = fit(kept_of_recent_rounds)       # Fit(model=ClockModel(...), residual_ns=..., ...)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence

from tf_otel.clock import ClockModel

DROP_WORST = 0.10  # fraction of the slowest exchanges always dropped
KEEP_BEST = 0.25  # fraction of the exchanges kept for the fit (the fastest ones)
MIN_KEEP = 3
MIN_DRIFT_SPAN_NS = 20_000_000  # fit a drift only over samples spanning >= 20 ms


@dataclass(frozen=True)
class Exchange:
    t0: int  # client send (local clock)
    t1: int  # reference receive (reference clock)
    t2: int  # reference send (reference clock)
    t3: int  # client receive (local clock)

    @property
    def offset_ns(self) -> float:
        return ((self.t1 - self.t0) + (self.t2 - self.t3)) / 2.0

    @property
    def rtt_ns(self) -> int:
        return (self.t3 - self.t0) - (self.t2 - self.t1)

    @property
    def mid_ns(self) -> int:
        return (self.t0 + self.t3) // 2


@dataclass(frozen=True)
class Sample:
    mid_ns: int  # local time of the exchange (middle of t0..t3)
    offset_ns: float  # reference - local
    rtt_ns: int


@dataclass(frozen=True)
class RoundStats:
    sent: int
    valid: int
    kept: int
    rtt_min_ns: int
    rtt_median_ns: int


@dataclass(frozen=True)
class Fit:
    model: ClockModel
    residual_ns: float  # weighted RMS of the kept samples around the line
    rtt_min_ns: int
    samples: int
    span_ns: int  # local time covered by the samples
    drift_fitted: bool


def to_samples(exchanges: Iterable[Exchange]) -> List[Sample]:
    """Exchanges with a sane RTT (>= 0: clocks that moved mid-exchange are dropped)."""
    out = []
    for ex in exchanges:
        rtt = ex.rtt_ns
        if rtt >= 0 and ex.t3 >= ex.t0 and ex.t2 >= ex.t1:
            out.append(Sample(ex.mid_ns, ex.offset_ns, rtt))
    return out


def select(
    exchanges: Sequence[Exchange],
    drop_worst: float = DROP_WORST,
    keep_best: float = KEEP_BEST,
    min_keep: int = MIN_KEEP,
) -> List[Sample]:
    """The low-RTT samples of one round, fastest first."""
    samples = sorted(to_samples(exchanges), key=lambda s: s.rtt_ns)
    if not samples:
        return []
    n = len(samples)
    limit = n - int(n * drop_worst)
    keep = max(min(min_keep, limit), int(math.ceil(n * keep_best)))
    return samples[: min(keep, limit) or 1]


def round_stats(exchanges: Sequence[Exchange], kept: Sequence[Sample]) -> RoundStats:
    rtts = sorted(s.rtt_ns for s in to_samples(exchanges))
    return RoundStats(
        sent=len(exchanges),
        valid=len(rtts),
        kept=len(kept),
        rtt_min_ns=rtts[0] if rtts else 0,
        rtt_median_ns=rtts[len(rtts) // 2] if rtts else 0,
    )


def _weights(samples: Sequence[Sample]) -> List[float]:
    """1 / sigma^2 with sigma = the RTT excess over the fastest sample plus a floor."""
    rtt_min = min(s.rtt_ns for s in samples)
    floor = max(500.0, 0.1 * rtt_min)
    return [1.0 / ((s.rtt_ns - rtt_min + floor) ** 2) for s in samples]


def fit(
    samples: Sequence[Sample],
    prior_drift: float = 0.0,
    min_drift_span_ns: int = MIN_DRIFT_SPAN_NS,
) -> Optional[Fit]:
    """Weighted least squares: offset(t) = a + drift * (t - anchor); None without samples.

    Over a short span the drift is not identifiable (the noise would dominate), so the line is
    fitted with ``prior_drift`` fixed until the samples span ``min_drift_span_ns``.
    """
    if not samples:
        return None
    w = _weights(samples)
    sw = sum(w)
    base_t = samples[0].mid_ns
    base_y = samples[0].offset_ns
    # Work relative to the first sample so the floats keep their ns precision.
    xs = [s.mid_ns - base_t for s in samples]
    ys = [s.offset_ns - base_y for s in samples]
    mx = sum(wi * x for wi, x in zip(w, xs)) / sw
    span = max(s.mid_ns for s in samples) - min(s.mid_ns for s in samples)
    drift = prior_drift
    fitted = False
    if span >= min_drift_span_ns and len(samples) >= 2:
        sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs))
        if sxx > 0:
            my = sum(wi * y for wi, y in zip(w, ys)) / sw
            sxy = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ys))
            drift = sxy / sxx
            fitted = True
    a = sum(wi * (y - drift * (x - mx)) for wi, x, y in zip(w, xs, ys)) / sw
    resid2 = sum(wi * (y - a - drift * (x - mx)) ** 2 for wi, x, y in zip(w, xs, ys)) / sw
    residual = math.sqrt(resid2)
    rtt_min = min(s.rtt_ns for s in samples)
    anchor = base_t + int(round(mx))
    model = ClockModel(
        offset_ns=int(round(base_y + a)),
        drift=drift,
        anchor_ns=anchor,
        # the best exchange bounds the error by rtt/2; the residual adds the spread around the line
        uncertainty_ns=int(math.ceil(rtt_min / 2.0 + residual)),
    )
    return Fit(model, residual, rtt_min, len(samples), span, fitted)
