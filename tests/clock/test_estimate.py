"""The estimator on synthetic exchanges with a known offset, drift and jitter."""

from __future__ import annotations

import random
import statistics
from typing import List

from tf_otel.clock.estimate import Exchange, fit, round_stats, select

T0 = 10**18  # true time at which the synthetic offset is offset_ns


def synth_round(
    rng: random.Random,
    start_true_ns: int,
    offset_ns: float,
    drift: float,
    n: int,
    base_ns: int = 20_000,
    jitter_ns: float = 3_000.0,
    outliers: float = 0.0,
) -> List[Exchange]:
    """Exchanges between a reference (true time) and a local clock local = t - offset(t).

    ``offset(t) = offset_ns + drift * (t - T0)`` is reference - local; one-way delays are a base
    plus independent exponential jitter; ``outliers`` of them get a 1 ms delay on one leg only.
    """
    out = []
    t = start_true_ns
    for _ in range(n):
        fwd = base_ns / 2 + rng.expovariate(1 / jitter_ns)
        back = base_ns / 2 + rng.expovariate(1 / jitter_ns)
        if rng.random() < outliers:
            fwd += 1_000_000
        proc = 2_000 + rng.random() * 1_000

        def local(true_ns: float) -> int:
            return int(true_ns - (offset_ns + drift * (true_ns - T0)))

        t0 = local(t)
        t1 = int(t + fwd)
        t2 = int(t + fwd + proc)
        t3 = local(t + fwd + proc + back)
        out.append(Exchange(t0, t1, t2, t3))
        t += fwd + proc + back + 5_000
    return out


def true_offset(offset_ns: float, drift: float, local_ns: int) -> float:
    # local = t - offset - drift (t - T0)  =>  t - T0 = (local - T0 + offset) / (1 - drift)
    dt = (local_ns - T0 + offset_ns) / (1 - drift)
    return offset_ns + drift * dt


def test_exchange_formulas() -> None:
    ex = Exchange(t0=100, t1=1_150, t2=1_160, t3=220)
    # forward 50 + offset 1000 ... symmetric delays of 55: offset 1000 - 0
    assert ex.rtt_ns == (220 - 100) - (1_160 - 1_150)
    assert ex.offset_ns == ((1_150 - 100) + (1_160 - 220)) / 2
    assert ex.mid_ns == 160


def test_constant_offset_recovered_within_jitter() -> None:
    rng = random.Random(1)
    ex = synth_round(rng, T0, offset_ns=2e9, drift=0.0, n=200)
    kept = select(ex)
    result = fit(kept)
    assert result is not None
    err = abs(result.model.offset_at(result.model.anchor_ns) - 2e9)
    # The kept samples' asymmetry is what is left: far below the 3 us jitter scale.
    assert err < 1_500, err
    assert not result.drift_fitted  # one short round: no drift fit
    assert result.model.uncertainty_ns >= err  # the reported uncertainty covers the error


def test_min_rtt_selection_drops_outliers() -> None:
    rng = random.Random(2)
    ex = synth_round(rng, T0, offset_ns=-5e5, drift=0.0, n=100, outliers=0.3)
    kept = select(ex)
    assert len(kept) == 25
    assert max(s.rtt_ns for s in kept) < 1_000_000  # no one-sided 1 ms delay survives
    naive = statistics.mean(e.offset_ns for e in ex)
    result = fit(kept)
    assert result is not None
    assert abs(naive - -5e5) > 50_000  # the outliers do bias a plain mean ...
    assert abs(result.model.offset_ns - -5e5) < 2_000  # ... but not the min-RTT fit


def test_offset_and_drift_over_rounds() -> None:
    rng = random.Random(3)
    offset, drift = -2e9, 200e-6
    samples = []
    start = T0
    for k in range(8):
        samples += select(synth_round(rng, start + k * 200_000_000, offset, drift, n=64))
    result = fit(samples)
    assert result is not None and result.drift_fitted
    assert abs(result.model.drift - drift) < 0.5e-6
    # compare model vs truth across the span and 1 s beyond it
    for local in range(samples[0].mid_ns, samples[-1].mid_ns + 10**9, 50_000_000):
        assert abs(result.model.offset_at(local) - true_offset(offset, drift, local)) < 2_000


def test_prior_drift_used_when_span_is_short() -> None:
    rng = random.Random(4)
    ex = synth_round(rng, T0, 0.0, 100e-6, n=20)
    assert fit(select(ex), prior_drift=100e-6).model.drift == 100e-6  # type: ignore[union-attr]
    assert fit(select(ex)).model.drift == 0.0  # type: ignore[union-attr]


def test_invalid_exchanges_dropped_and_stats() -> None:
    good = Exchange(0, 1_000, 1_100, 300)
    bad = Exchange(0, 1_000, 1_100, 50)  # negative RTT: the clock stepped mid-exchange
    kept = select([good, bad])
    assert [s.rtt_ns for s in kept] == [200]
    stats = round_stats([good, bad], kept)
    assert (stats.sent, stats.valid, stats.kept, stats.rtt_min_ns) == (2, 1, 1, 200)
    assert fit([]) is None
