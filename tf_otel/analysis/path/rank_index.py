"""Each rank's timeline spans, searchable for the path walk (critical_path.py): the span that
ended last at or before a time (a sync ending just after it counts as ended: the overlap
tolerance), the compute or input span still running then, the framework span filling a gap.

Usage::

    indexes = LazyIndexes(step)        # rank -> RankIndex, built when the path first visits it
    span, running = indexes[rank].last_before(t, tolerance)
    name, span_id = indexes[rank].gap_name(start, end)
"""

from __future__ import annotations

import bisect
from operator import attrgetter
from typing import Dict, List, Optional, Set, Tuple

from tf_otel.analysis.model import Span
from tf_otel.analysis.steps import RankTimeline, StepTrace
from tf_otel.record import COLLECTIVE, COMPUTE, INPUT, TRANSFER

_PRIORITY = {COLLECTIVE: 3, TRANSFER: 2, COMPUTE: 1, INPUT: 0}
_PARTIAL_OK = frozenset((COMPUTE, INPUT))
_SYNC = frozenset((COLLECTIVE, TRANSFER))
_CONCURRENT_LOOK = 8

_START_ID = attrgetter("start_ns", "span_id")
_END_START = attrgetter("end_ns", "start_ns")


def _sorted_by_end(nodes: List[Span]) -> List[Span]:
    """By (end, start, category priority, span id); the last two only matter on ties."""
    keys = list(map(_END_START, nodes))
    if len(set(keys)) == len(keys):  # no ties: the C-level key gives the same order
        return sorted(nodes, key=_END_START)
    return sorted(
        nodes, key=lambda s: (s.end_ns, s.start_ns, _PRIORITY.get(s.category, 0), s.span_id)
    )


class RankIndex:
    """Timeline spans of one rank, searchable by end (last ended) and start (still running)."""

    def __init__(self, timeline: RankTimeline) -> None:
        self.timeline = timeline
        nodes = _sorted_by_end(timeline.nodes)
        self.by_end = nodes
        self.ends = [s.end_ns for s in nodes]
        self.limit = len(nodes)  # spans at or after this index are used or ended too late
        self.concurrent: Set[str] = set()  # syncs running beyond the tolerance where the path was
        # the sync spans alone, by end, with their places in ``by_end``: what the overlap
        # tolerance looks at (a rank has a few syncs beside many ops)
        places = [self._place(s) for s in timeline.syncs]
        if None in places:  # a sync not among the nodes as the same object: look at all
            places = [i for i, s in enumerate(nodes) if s.category in _SYNC]
        self.sync_at: List[int] = sorted(places)  # type: ignore[arg-type]
        self.sync_ends = [nodes[i].end_ns for i in self.sync_at]
        self._partial: Optional[Tuple[List[int], List[Span]]] = None
        self._fillers: Optional[Tuple[List[int], List[Span]]] = None

    def _place(self, span: Span) -> Optional[int]:
        """``span``'s index in ``by_end`` (a bisect, then past any equal ends); None: absent."""
        ends, nodes = self.ends, self.by_end
        at = bisect.bisect_left(ends, span.end_ns)
        while at < len(nodes) and ends[at] == span.end_ns:
            if nodes[at] is span:
                return at
            at += 1
        return None

    def _partial_index(self) -> Tuple[List[int], List[Span]]:
        """Starts of the compute/input spans, and per prefix the one reaching furthest."""
        if self._partial is None:
            partial = sorted(
                [s for s in self.timeline.nodes if s.category in _PARTIAL_OK], key=_START_ID
            )
            reach: List[Span] = []
            best: Optional[Span] = None
            for span in partial:
                if best is None or span.end_ns > best.end_ns:
                    best = span
                reach.append(best)
            self._partial = ([s.start_ns for s in partial], reach)
        return self._partial

    def last_before(self, t: int, tolerance: int = 0) -> Tuple[Optional[Span], bool]:
        """The span the path takes at time t, and whether it is still running at t. A sync
        span (collective, transfer) that began before t and ended at most ``tolerance`` after
        it is taken as ending at t: recording overlap, not concurrency (``overlap_tolerance``);
        of several, the one that ended last."""
        index = min(bisect.bisect_right(self.ends, t), self.limit) - 1
        ended = self.by_end[index] if index >= 0 else None
        if ended is not None and ended.end_ns == t:
            self.limit = index
            return ended, False
        if tolerance > 0 and self.sync_at:
            sync_at, sync_ends = self.sync_at, self.sync_ends
            cut = bisect.bisect_right(sync_ends, t + tolerance)
            for k in range(cut - 1, -1, -1):
                at = sync_at[k]
                if at <= index:
                    break  # ended at or before t
                span = self.by_end[at]
                if at < self.limit and span.start_ns < t:
                    self.limit = at
                    return span, False
            # a sync still running beyond the tolerance: real concurrency, the path stays
            # with what ended last (counted once a span; a bounded look, nearest ends first)
            for k in range(cut, min(cut + _CONCURRENT_LOOK, len(sync_at))):
                at = sync_at[k]
                if at >= self.limit:
                    break  # the later ones were passed already
                span = self.by_end[at]
                if span.start_ns < t:
                    self.concurrent.add(span.span_id)
        starts, reach = self._partial_index()
        cut = bisect.bisect_left(starts, t)
        if cut > 0:
            running = reach[cut - 1]
            if running.end_ns > t:
                return running, True
        if ended is not None:
            self.limit = index
        return ended, False

    def gap_name(self, start: int, end: int) -> Tuple[str, Optional[str]]:
        """The framework/kernel span overlapping [start, end) most, else '(gap)'."""
        if self._fillers is None:
            fillers = sorted(self.timeline.fillers, key=_START_ID)
            self._fillers = ([s.start_ns for s in fillers], fillers)
        starts, fillers = self._fillers
        best: Optional[Span] = None
        best_overlap = 0
        last = bisect.bisect_left(starts, end) - 1
        for i in range(last, max(-1, last - 64), -1):  # bounded scan, nearest starts first
            span = fillers[i]
            overlap = min(end, span.end_ns) - max(start, span.start_ns)
            if overlap > best_overlap:
                best, best_overlap = span, overlap
        if best is None:
            return "(gap)", None
        return best.name, best.span_id


class LazyIndexes(Dict[int, RankIndex]):
    """Rank -> index, built on first use: the path visits only a few ranks of a step."""

    def __init__(self, step: StepTrace) -> None:
        super().__init__()
        self.step = step

    def __missing__(self, rank: int) -> RankIndex:
        index = self[rank] = RankIndex(self.step.ranks[rank])
        return index
