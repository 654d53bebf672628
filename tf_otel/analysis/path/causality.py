"""Causality repair before analysis: no collective may end on one rank before the last rank
began it.

A collective cannot complete on any rank before the last rank has entered it. After clock
correction a residual error can still make one rank's end precede another rank's start; this
module finds those violations and repairs them with a controlled-logical-clock style forward
shift (Scalasca / Rabenseifner): the violating rank's time line is moved forward from the
violating end onwards, by just enough, and the shift is kept for everything later on that rank.
The per-rank mapping ``t -> t + shift(t)`` is strictly increasing, so a child that was inside
its parent stays inside it; intervals that straddle a shift point only get longer.
``repair_causality`` applies the shifts to every span of the shifted rank in that step trace.

Usage::

    repaired = repair_causality(spans)     # spans are changed in place
    repaired.violations, repaired.max_shift_ns

    records = [CollectiveRecord(rank=0, key="allreduce.0", start_ns=..., end_ns=...), ...]
    violations = find_violations(records)
    fix = correct(records)                 # Correction
    fix.apply(rank, t_ns)                  # any timestamp of that rank, span or child
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import Any, Dict, Hashable, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from tf_otel.analysis.model import Span
from tf_otel.analysis.steps import spans_by_trace
from tf_otel.record import ATTR_COLLECTIVE_KEY, COLLECTIVE, STEP_ROOT

_CATEGORY = attrgetter("category")


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


class Shift(NamedTuple):
    """From ``at_ns`` (the rank's own, uncorrected time) on, the rank moves ``by_ns`` later."""

    at_ns: int
    by_ns: int


@dataclass
class Correction:
    """Per-rank forward shifts: a step function of the rank's own (uncorrected) time."""

    steps: Dict[int, List[Shift]] = field(default_factory=dict)  # rank -> its shifts
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
        self.steps.setdefault(rank, []).append(Shift(at_ns, inc_ns))
        self._cache.pop(rank, None)

    @property
    def max_shift_ns(self) -> int:
        return max((sum(s.by_ns for s in shifts) for shifts in self.steps.values()), default=0)


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


# Spans: the repair the analyzer runs on every step trace.


@dataclass
class CausalityRepair:
    violations: int = 0
    traces: int = 0  # step traces that needed a shift
    max_shift_ns: int = 0


def repair_causality(spans: List[Span]) -> CausalityRepair:
    return repair_trace_causality(spans_by_trace(spans))


def repair_trace_causality(traces: Dict[str, List[Span]]) -> CausalityRepair:
    """``repair_causality`` on spans already split by trace (``steps.spans_by_trace``)."""
    repair = CausalityRepair()
    for trace_spans in traces.values():
        members = [
            (span, key)
            for span in compress(trace_spans, map(COLLECTIVE.__eq__, map(_CATEGORY, trace_spans)))
            if span.rank is not None
            and (key := span.attributes.get(ATTR_COLLECTIVE_KEY)) is not None
        ]
        if not members or not _may_violate(members):
            continue
        # members hold only spans with a rank (the filter above)
        fix = correct([CollectiveRecord(s.rank, key, s.start_ns, s.end_ns) for s, key in members])  # type: ignore[arg-type]
        if fix.violations:
            repair.violations += len(fix.violations)
            repair.traces += 1
            _shift(trace_spans, fix, repair)
    return repair


def _may_violate(members: List[Tuple[Span, Any]]) -> bool:
    """Whether some collective ends on one rank before another rank began it (cheap check)."""
    last_start: Dict[Any, int] = {}
    first_end: Dict[Any, int] = {}
    for span, key in members:
        if last_start.get(key, span.start_ns) <= span.start_ns:
            last_start[key] = span.start_ns
        if first_end.get(key, span.end_ns) >= span.end_ns:
            first_end[key] = span.end_ns
    return any(first_end[key] < start for key, start in last_start.items())


def _shift(trace_spans: List[Span], fix: Correction, repair: CausalityRepair) -> None:
    root: Optional[Span] = None
    for span in trace_spans:
        if span.category == STEP_ROOT:
            root = span
            continue
        if span.rank is None:
            continue
        shift_start = fix.shift_ns(span.rank, span.start_ns)
        shift_end = fix.shift_ns(span.rank, span.end_ns)
        repair.max_shift_ns = max(repair.max_shift_ns, shift_start, shift_end)
        span.start_ns += shift_start
        span.end_ns += shift_end
    if root is not None:  # the root still covers every rank
        root.end_ns = max([root.end_ns] + [s.end_ns for s in trace_spans])
