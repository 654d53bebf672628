"""The figures findings state, written one way by every rule: milliseconds, MiB, a median, a
severity, a list of ranks.

Usage::

    ms(1_234_567)              # 1.235 (ns -> ms, 3 decimals: exact to the microsecond)
    mib(3 * 2**20)             # 3.0
    median([3.0, 1.0, 2.0])    # 2.0
    severity(0.05)             # "medium": the share of the total time at stake
    ranks_text([0, 2])         # "ranks 0, 2"
"""

from __future__ import annotations

from typing import Sequence

HIGH_SHARE = 0.10  # of the total time at stake: high
MEDIUM_SHARE = 0.03  # medium; below it, low
# a straggler (a rank, or a replica in a process) is a finding when what it cost is at least
# this share of the steady steps' time, or it was late in at least this share of them
STRAGGLER_MIN_SAVING_SHARE = 0.02
STRAGGLER_MIN_STEP_SHARE = 0.10
MAX_LISTED_STEPS = 20  # steps listed in a finding's evidence


def straggles_enough(saving_share: float, step_share: float) -> bool:
    """A straggler's late steps make a finding: what they cost, or how many they are."""
    return saving_share >= STRAGGLER_MIN_SAVING_SHARE or step_share >= STRAGGLER_MIN_STEP_SHARE


def ms(ns: float) -> float:
    return round(ns / 1e6, 3)


def mib(value: float) -> float:
    return round(value / 2**20, 3)


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def severity(share: float) -> str:
    """high when the time at stake is >= 10 % of the total, medium >= 3 %, else low."""
    return "high" if share >= HIGH_SHARE else "medium" if share >= MEDIUM_SHARE else "low"


def ranks_text(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
