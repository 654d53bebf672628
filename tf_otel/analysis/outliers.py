"""Step-time outliers by median and MAD (robust to the outliers themselves).

Usage::

    stats = step_outliers({0: 100, 1: 101, 2: 250})
    stats.outliers  # [2]

A step is an outlier when its duration exceeds median + max(3.5 * MAD / 0.6745, 5% of median)
(the Iglewicz-Hoaglin modified z-score 3.5; the 5% floor keeps near-constant runs quiet).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Dict, List

MODIFIED_Z = 3.5
MAD_TO_SIGMA = 0.6745
MIN_RELATIVE_EXCESS = 0.05


@dataclass
class OutlierStats:
    median_ns: int = 0
    mad_ns: int = 0
    threshold_ns: int = 0
    outliers: List[int] = field(default_factory=list)  # keys of the outlier steps


def step_outliers(durations: Dict[int, int]) -> OutlierStats:
    """``durations``: step key -> duration (ns). Outliers sorted by key."""
    if not durations:
        return OutlierStats()
    values = list(durations.values())
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    threshold = median + max(MODIFIED_Z * mad / MAD_TO_SIGMA, MIN_RELATIVE_EXCESS * median)
    slow = sorted(key for key, value in durations.items() if value > threshold)
    if len(values) < 3:
        slow = []  # two steps cannot say which one is unusual
    return OutlierStats(int(median), int(mad), int(threshold), slow)
