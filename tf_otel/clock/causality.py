"""Causality check and repair for collectives (analysis time, pure functions).

A collective cannot complete on any rank before the last rank has entered it. After clock
correction a residual error can still make one rank's end precede another rank's start; this
module finds those violations and repairs them with a controlled-logical-clock style forward
shift (Scalasca / Rabenseifner): the violating rank's time line is moved forward from the
violating end onwards, by just enough, and the shift is kept for everything later on that rank.
The per-rank mapping ``t -> t + shift(t)`` is strictly increasing, so a child that was inside
its parent stays inside it; intervals that straddle a shift point only get longer.

Usage::

    records = [CollectiveRecord(rank=0, key="allreduce.0", start_ns=..., end_ns=...), ...]
    violations = find_violations(records)
    fix = correct(records)                 # Correction
    fix.apply(rank, t_ns)                  # any timestamp of that rank, span or child
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, Hashable, Iterable, List, Sequence, Tuple


@dataclass(frozen=True)
class CollectiveRecord:
    rank: int
    key: Hashable  # the same on every rank for one collective instance
    start_ns: int  # reference time
    end_ns: int


@dataclass(frozen=True)
class Violation:
    key: Hashable
    rank: int
    end_ns: int  # this rank's end
    last_start_ns: int  # when the last rank began the collective
    by_ns: int  # last_start + min_latency - end (> 0)


@dataclass
class Correction:
    """Per-rank forward shifts: a step function of the rank's own (uncorrected) time."""

    steps: Dict[int, List[Tuple[int, int]]] = field(default_factory=dict)  # rank -> [(at, +ns)]
    violations: List[Violation] = field(default_factory=list)  # found before correcting
    passes: int = 0
    _cache: Dict[int, Tuple[List[int], List[int]]] = field(default_factory=dict, repr=False)

    def shift_ns(self, rank: int, t_ns: int) -> int:
        """How far ``t_ns`` on ``rank`` moves forward (0 before the first correction)."""
        cached = self._cache.get(rank)
        if cached is None:
            steps = sorted(self.steps.get(rank, ()))
            ats, total, sums = [], 0, []
            for at, inc in steps:
                total += inc
                ats.append(at)
                sums.append(total)
            cached = self._cache[rank] = (ats, sums)
        ats, sums = cached
        i = bisect.bisect_right(ats, t_ns)
        return sums[i - 1] if i else 0

    def apply(self, rank: int, t_ns: int) -> int:
        return t_ns + self.shift_ns(rank, t_ns)

    def add(self, rank: int, at_ns: int, inc_ns: int) -> None:
        self.steps.setdefault(rank, []).append((at_ns, inc_ns))
        self._cache.pop(rank, None)

    @property
    def max_shift_ns(self) -> int:
        return max((sum(inc for _, inc in s) for s in self.steps.values()), default=0)


def _by_key(records: Iterable[CollectiveRecord]) -> Dict[Hashable, List[CollectiveRecord]]:
    groups: Dict[Hashable, List[CollectiveRecord]] = defaultdict(list)
    for rec in records:
        groups[rec.key].append(rec)
    return groups


def find_violations(
    records: Sequence[CollectiveRecord], min_latency_ns: int = 0
) -> List[Violation]:
    """Every (collective, rank) whose end precedes the last rank's start (+ ``min_latency_ns``)."""
    out = []
    for key, group in _by_key(records).items():
        if len(group) < 2:
            continue
        last_start = max(r.start_ns for r in group)
        for rec in group:
            by = last_start + min_latency_ns - rec.end_ns
            if by > 0:
                out.append(Violation(key, rec.rank, rec.end_ns, last_start, by))
    return sorted(out, key=lambda v: (v.last_start_ns, v.rank))


def correct(
    records: Sequence[CollectiveRecord], min_latency_ns: int = 0, max_passes: int = 50
) -> Correction:
    """Forward shifts that leave no violation (see the module doc); ``records`` is not changed.

    Collectives are replayed in order of their last start; a shift on one rank can delay that
    rank's later starts and so create a later violation elsewhere, which the same replay repairs
    (a cascade only ever moves time forward, so it converges; ``max_passes`` is a safety bound).
    """
    fix = Correction(violations=find_violations(records, min_latency_ns))
    if not fix.violations:
        return fix
    groups = sorted(_by_key(records).values(), key=lambda g: max(r.start_ns for r in g))
    for n in range(1, max_passes + 1):
        fix.passes = n
        changed = False
        for group in groups:
            if len(group) < 2:
                continue
            last_start = max(fix.apply(r.rank, r.start_ns) for r in group)
            for rec in group:
                end = fix.apply(rec.rank, rec.end_ns)
                by = last_start + min_latency_ns - end
                if by > 0:
                    fix.add(rec.rank, rec.end_ns, by)
                    changed = True
        if not changed:
            break
    return fix
