"""Rank lateness against the run's own noise: the one model the offline analysis
(analysis/stragglers.py) and rank 0's live verdicts (cluster/verdicts.py) judge stragglers by.

Usage::

    noise = noise_of([{0: 0, 1: 2_000_000, 2: 150_000_000}, ...], min_ns=1_000_000)
    late = lateness > noise.threshold_for(rank)

``per_step``: each steady step's lateness by rank (ns; how much later than the other ranks'
median the rank was ready). The threshold is the steps' worst lateness, median + NOISE_SIGMAS
robust sigmas; ranks late in most steps are first measured against their own usual lateness.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Sequence

NOISE_SIGMAS = 5.0
MAD_TO_SIGMA = 1.4826
UPPER_QUARTILE_Z = 0.6745  # the upper quartile of a normal distribution, in sigmas
MIN_NOISE_STEPS = 3


@dataclass
class StragglerNoise:
    """What the run's own rank lateness looks like when nobody is slowed."""

    center_ns: int = 0
    sigma_ns: int = 0
    threshold_ns: int = 0
    samples: int = 0
    baseline_ns: Dict[int, int] = field(default_factory=dict)  # each rank's median lateness

    persistent_ns: Dict[int, int] = field(default_factory=dict)  # late in most steps
    typical_step_ns: int = 0  # the median steady step

    def threshold_for(self, rank: int) -> int:
        """A rank that is late in most steps is measured against its own usual lateness."""
        return self.threshold_ns + self.persistent_ns.get(rank, 0)

    def delayed(self, over_typical_ns: int) -> bool:
        """Whether a step longer than the typical steady step by ``over_typical_ns`` was delayed
        beyond the noise. The typical step already holds the usual worst lateness (``center_ns``),
        so a rank late by L stretches the step by about L - center: that is what must pass the
        noise beyond the center (a late rank in a step no longer than usual delayed nothing)."""
        return over_typical_ns > self.threshold_ns - max(0, self.center_ns)

    def persistent(self) -> Dict[int, int]:
        """Ranks late in most steps beyond the noise: rank -> median lateness."""
        return dict(self.persistent_ns)


def _median(values: Iterable[float]) -> float:
    return statistics.median(values)


def noise_of(per_step: Sequence[Mapping[int, int]], min_ns: int) -> StragglerNoise:
    """The threshold a step's worst lateness must pass: learned from the steps' worst lateness
    (median + NOISE_SIGMAS robust sigmas), after taking out the usual lateness of the ranks that
    are late in most steps (median lateness beyond NOISE_SIGMAS sigmas of the ranks' own
    step-to-step variation)."""
    per_rank: Dict[int, List[int]] = {}
    for values in per_step:
        for rank, value in values.items():
            per_rank.setdefault(rank, []).append(value)
    pool = [v for values in per_rank.values() for v in values]
    if len(per_step) < MIN_NOISE_STEPS or not pool:
        return StragglerNoise(0, 0, min_ns, len(pool))
    center = _median(pool)
    baseline = {rank: int(_median(values)) for rank, values in sorted(per_rank.items())}
    residuals = [abs(v - baseline[r]) for r, values in per_rank.items() for v in values]
    spread = MAD_TO_SIGMA * _median(residuals)
    persistent = {
        rank: usual
        for rank, usual in baseline.items()
        if usual - center > max(min_ns, NOISE_SIGMAS * spread)
    }
    worst = [
        max(v - persistent.get(r, 0) for r, v in values.items()) for values in per_step if values
    ]
    middle = _median(worst)
    ordered = sorted(worst)
    upper_quartile = ordered[(3 * (len(ordered) - 1)) // 4]
    # the larger of the MAD and the upper half's spread: lateness is skewed and heavy-tailed,
    # and a few quiet steps must not make every hiccup a straggler
    sigma = max(
        MAD_TO_SIGMA * _median(abs(v - middle) for v in worst),
        (upper_quartile - middle) / UPPER_QUARTILE_Z,
    )
    threshold = max(min_ns, int(middle + NOISE_SIGMAS * sigma))
    return StragglerNoise(int(middle), int(sigma), threshold, len(worst), baseline, persistent)


def medians_without(ordered: List[int]) -> Callable[[int], int]:
    """value -> the median of ``ordered`` (sorted, at least two values) with one occurrence of
    ``value`` (one of its values) left out, without a search: the value left out shifts the
    middle only where it lies below it (``ordered[i] < value`` exactly where one of the values
    before ``i`` is left out: the first occurrence goes)."""
    k = (len(ordered) - 1) // 2
    if (len(ordered) - 1) % 2:
        low, high = ordered[k], ordered[k + 1]
        return lambda value: low if low < value else high
    a, b, c = ordered[k - 1], ordered[k], ordered[k + 1]
    return lambda value: int(((a if a < value else b) + (b if b < value else c)) / 2)
