"""The cross-rank critical path of one step.

Usage::

    path = critical_path(step_trace)
    path.by_category()   # {"compute": ns, "input": ns, "communication": ns, ...}
    path.by_rank()       # {0: ns, 1: ns}

The step is a DAG: on each rank its timeline spans (compute, input, collective, transfer) in
time order; a collective's completion on every rank depends on every rank's arrival, joined
across ranks by ``tf_otel.collective.key``; a PS transfer's completion depends on the peer span
with the same ``tensorflow.transfer.edge``. The path is walked back from the end of the rank
that finished last, jumping at each collective to the rank that arrived last (Horovod's
``horovod.last_arrival`` where exactly one rank says so, else the latest start; a hidden
arrival is estimated from the rank's own spans). Ties stay on the current rank, else the lowest
rank, so the path is deterministic. Its time is split into ``compute``, ``input``,
``communication``, ``straggler_wait``, ``framework`` and ``before_step``.

The path is cut into legs at every sync point; a leg on rank r is compared with the same leg
on every other rank: ``excess_ns`` = leg - median of the others, ``saving_ns`` = leg - slowest
other. What a rank carried in from the previous step (``carry``) comes off its first leg
wherever legs are compared. The rules, the categories and their edge cases:
docs/guides/ANALYSIS.md ("The cross-rank critical path", "Stragglers and the what-if").
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Dict, List, Optional, Set, Tuple

from tf_otel.analysis.model import (
    ATTR_LAST_ARRIVAL,
    ATTR_TRANSFER_EDGE,
    ATTR_WAIT_NS,
    Span,
)
from tf_otel.analysis.path.carry import CARRIED_NAME, Carry
from tf_otel.analysis.path.rank_index import LazyIndexes
from tf_otel.analysis.path.sync_points import (
    READY,
    STEP_END,
    STEP_START,
    Arrivals,
    SyncKey,
    arrival_hidden,
    collective_index,
    collective_wait_end,
    estimated_arrivals,
    hidden_syncs,
    known_before,
    last_arrival,
    sync_key,
    transfer_index,
    waits_for_unseen_rank,
)
from tf_otel.analysis.steps import RankTimeline, StepTrace
from tf_otel.lateness import medians_without
from tf_otel.record import (
    ATTR_CLOCK_UNCERTAINTY,
    COLLECTIVE,
    COMPUTE,
    INPUT,
)

__all__ = ["ATTR_LAST_ARRIVAL", "ATTR_TRANSFER_EDGE", "ATTR_WAIT_NS", "critical_path"]

# Path categories, in report order.
PATH_COMPUTE = "compute"
PATH_INPUT = "input"
PATH_COMMUNICATION = "communication"
PATH_STRAGGLER_WAIT = "straggler_wait"
PATH_FRAMEWORK = "framework"
PATH_BEFORE_STEP = "before_step"
PATH_CATEGORIES = (
    PATH_COMPUTE,
    PATH_INPUT,
    PATH_COMMUNICATION,
    PATH_STRAGGLER_WAIT,
    PATH_FRAMEWORK,
    PATH_BEFORE_STEP,
)
STEP_WORK = "(rank step work)"  # a gap on a rank without op detail: its own step work
TOP_NAMES = 24  # names a step keeps of its path once its segments are dropped (by_name)
_NODE_CATEGORY = {COMPUTE: PATH_COMPUTE, INPUT: PATH_INPUT}
# Timestamps overlap by recording alone: GPU streams, float timestamps, clock error between
# ranks (production traces: median 5-16 us, p99 110 us). A sync span that ends at most this
# much plus the rank's clock uncertainty after the next op of its rank began is still that op's
# predecessor (docs/guides/ANALYSIS.md, "Overlap").
OVERLAP_FLOOR_NS = 200_000


@dataclass(slots=True)
class Segment:
    rank: int
    start_ns: int
    end_ns: int
    category: str
    name: str
    span_id: Optional[str] = None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(slots=True)
class Leg:
    """The path's stay on one rank between two sync points (collective keys or step edges)."""

    rank: int
    begin: SyncKey
    end: SyncKey
    start_ns: int
    end_ns: int
    median_other_ns: Optional[int] = None
    slowest_other_ns: Optional[int] = None
    # every rank's same leg (its own included): rank -> (start, end); a rank whose arrival is
    # unknown ends at the last thing it is known to have done (a lower bound); a first leg
    # starts after what the rank inherited from its previous step
    windows: Dict[int, Tuple[int, int]] = field(default_factory=dict, repr=False)
    # first leg only: what the leg's rank inherited from its previous step (``carry``), not
    # its own time
    inherited_ns: int = 0
    # first leg with something carried: the other ranks' (median, slowest) leg with nothing
    # taken off, by which the step waited for this rank (wall clock)
    waited_other_ns: Optional[Tuple[int, int]] = None

    @property
    def length_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns - self.inherited_ns)

    @property
    def syncs(self) -> bool:
        """Whether the leg ends where the ranks wait for each other (not at a rank's step end)."""
        return self.end != STEP_END or self.begin == STEP_START

    def lengths(self) -> Dict[int, int]:
        return {rank: max(0, end - start) for rank, (start, end) in self.windows.items()}

    def _beyond(self, other: int, waited: int) -> int:
        """The leg's length beyond ``other``; never more than the step waited for this rank
        beyond ``waited`` (the same, nothing taken off): the others' inherited time, taken
        off their legs, must not make this rank's excess larger than the wait it caused."""
        beyond = self.length_ns - other
        if self.waited_other_ns is not None:
            beyond = min(beyond, self.end_ns - self.start_ns - waited)
        return max(0, beyond)

    @property
    def excess_ns(self) -> int:
        if self.median_other_ns is None:
            return 0
        waited = self.waited_other_ns[0] if self.waited_other_ns else 0
        return self._beyond(self.median_other_ns, waited)

    @property
    def saving_ns(self) -> int:
        if self.slowest_other_ns is None:
            return 0
        waited = self.waited_other_ns[1] if self.waited_other_ns else 0
        return self._beyond(self.slowest_other_ns, waited)


@dataclass
class CriticalPath:
    step: StepTrace
    segments: List[Segment] = field(default_factory=list)  # in time order
    legs: List[Leg] = field(default_factory=list)  # in time order
    # for the straggler statistics (None: not collected)
    arrivals: Optional[Arrivals] = field(default=None, repr=False)
    # the rank with the most excess and its excess by category (stragglers.keep_for_statistics:
    # taken while the step still holds its op spans)
    top_split: Optional[Tuple[int, Dict[str, int]]] = field(default=None, repr=False)
    # what the straggler statistics count of the arrivals: rank -> collectives it was in, and
    # (rank, ns later than the others' median) for each collective some rank was strictly
    # last at (stragglers.keep_for_statistics; the arrivals and legs' windows then dropped)
    arrival_tally: Optional[Tuple[Dict[int, int], List[Tuple[int, int]]]] = field(
        default=None, repr=False
    )
    # collectives on the path whose last arrival was unknown and unexplained (nobody blamed)
    unattributed_waits: int = 0
    # sync spans the path took that ended within the overlap tolerance after the next op of
    # their rank began (``overlap_tolerance``), and syncs running beyond it where the path
    # passed (real concurrency: the path followed what ended last)
    overlaps: int = 0
    concurrent: int = 0
    # rank -> what it inherited from its previous step (``carry``), not its own work
    inherited: Dict[int, int] = field(default_factory=dict, repr=False)
    # every rank's own work in the step by rank in order (``replay.own_work``, taken by
    # stragglers.keep_for_statistics while the step has its spans; an array of int64)
    work: Any = field(default=None, repr=False)
    _lateness: Optional[Dict[int, int]] = field(default=None, repr=False)
    # (by category, by rank, length) once the segments are dropped (``drop_segments``)
    _totals: Optional[Tuple[Dict[str, int], Dict[int, int], int]] = field(default=None, repr=False)
    _names: Optional[Tuple[Tuple[str, str, int], ...]] = field(default=None, repr=False)

    @property
    def length_ns(self) -> int:
        if self._totals is not None:
            return self._totals[2]
        return sum(segment.duration_ns for segment in self.segments)

    def by_category(self) -> Dict[str, int]:
        if self._totals is not None:
            return dict(self._totals[0])
        totals = dict.fromkeys(PATH_CATEGORIES, 0)
        for segment in self.segments:
            totals[segment.category] += segment.duration_ns
        return totals

    def by_rank(self) -> Dict[int, int]:
        if self._totals is not None:
            return dict(self._totals[1])
        totals: Dict[int, int] = {}
        for segment in self.segments:
            totals[segment.rank] = totals.get(segment.rank, 0) + segment.duration_ns
        return dict(sorted(totals.items()))

    def by_name(self, top: int = TOP_NAMES) -> Tuple[Tuple[str, str, int], ...]:
        """The ``top`` names on the path by their time on it: (category, name, ns), most
        first (what ``tf-otel diff`` compares: the ops and collectives that changed)."""
        if self._names is None:  # the segments never change once walked: made once
            totals: Dict[Tuple[str, str], int] = {}
            for segment in self.segments:
                key = (segment.category, segment.name)
                totals[key] = totals.get(key, 0) + segment.end_ns - segment.start_ns
            ordered = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_NAMES]
            self._names = tuple((category, name, ns) for (category, name), ns in ordered)
        return self._names[:top]

    def drop_segments(self) -> None:
        """Keep only the path's totals (what every report but ``--with-path`` reads): a
        step's segments are most of what the analysis keeps of it. One pass over them."""
        if self._totals is not None:
            return
        categories = dict.fromkeys(PATH_CATEGORIES, 0)
        ranks: Dict[int, int] = {}
        names: Dict[Tuple[str, str], int] = {}
        length = 0
        for segment in self.segments:
            ns = segment.end_ns - segment.start_ns
            length += ns
            categories[segment.category] += ns
            ranks[segment.rank] = ranks.get(segment.rank, 0) + ns
            key = (segment.category, segment.name)
            names[key] = names.get(key, 0) + ns
        self._totals = (categories, dict(sorted(ranks.items())), length)
        if self._names is None:
            ordered = sorted(names.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_NAMES]
            self._names = tuple((category, name, ns) for (category, name), ns in ordered)
        self.segments = []

    def excess_by_rank(self) -> Dict[int, int]:
        """Over the legs that end at a sync (a rank finishing its step late after the last
        sync held nobody up in this step: it shows as a late start at the next one)."""
        totals: Dict[int, int] = {}
        for leg in self.legs:
            totals[leg.rank] = totals.get(leg.rank, 0) + (leg.excess_ns if leg.syncs else 0)
        return totals

    def saving_by_rank(self) -> Dict[int, int]:
        totals: Dict[int, int] = {}
        for leg in self.legs:
            totals[leg.rank] = totals.get(leg.rank, 0) + (leg.saving_ns if leg.syncs else 0)
        return totals

    def lateness_by_rank(self) -> Dict[int, int]:
        """Every rank's lateness in this step: over the path's legs, its leg minus the median
        of the other ranks' same leg (signed; the run's noise is learned from these)."""
        if self._lateness is not None:
            return self._lateness
        totals: Dict[int, int] = {}
        for leg in self.legs:
            lengths = leg.lengths()
            if len(lengths) < 2 or not leg.syncs:
                continue
            ordered = sorted(lengths.values())
            median_without = medians_without(ordered)
            for rank, length in lengths.items():
                totals[rank] = totals.get(rank, 0) + length - median_without(length)
        self._lateness = dict(sorted(totals.items()))
        return self._lateness


def critical_path(step: StepTrace, carried: Optional[Dict[int, Carry]] = None) -> CriticalPath:
    """``carried``: rank -> what it carried in from its previous step (``carry.carried_into``);
    None or empty: nothing (the first step, or no previous step to match)."""
    path = CriticalPath(step)
    carried = carried or {}
    path.inherited = {r: c.inherited_ns for r, c in carried.items() if c.inherited_ns > 0}
    if not step.ranks:
        return path
    indexes = LazyIndexes(step)
    syncs = collective_index(step)
    hidden = hidden_syncs(syncs)
    path.arrivals = {  # only where every rank's arrival is known
        key.name: {rank: span.start_ns for rank, span in members.items()}
        for key, members in syncs.items()
        if key not in hidden
    }
    transfers = transfer_index(step)
    hidden |= hidden_syncs(transfers)
    syncs.update(transfers)
    if not syncs and len(step.ranks) > 1 and not _has_op_spans(step):
        return _implicit_sync_path(path, carried)
    expected = set(step.expected_ranks)
    detailed: Dict[int, bool] = {}  # rank -> it has op spans (read for the ranks on the path)
    backward: List[Segment] = []
    legs: List[Leg] = []

    def add(rank: int, start: int, end: int, category: str, name: str, span_id=None) -> None:
        if end > start:
            # names repeat step after step: one string each, however many steps are kept
            backward.append(Segment(rank, start, end, category, sys.intern(name), span_id))

    def add_gap(rank: int, start: int, end: int) -> None:
        if end > start:
            name, span_id = indexes[rank].gap_name(start, end)
            category = PATH_FRAMEWORK
            if rank not in detailed:
                detailed[rank] = any(s.category == COMPUTE for s in step.ranks[rank].nodes)
            if not detailed[rank]:  # no op spans: the gap is the rank's own step work
                category, name = PATH_COMPUTE, (STEP_WORK if name == "(gap)" else name)
            # names repeat step after step: one string each, however many steps are kept
            backward.append(Segment(rank, start, end, category, sys.intern(name), span_id))

    last_end = max(t.end_ns for t in step.ranks.values())
    rank = min(r for r, t in step.ranks.items() if t.end_ns == last_end)
    add(rank, last_end, step.end_ns, PATH_FRAMEWORK, "(after last rank)")
    t = last_end
    leg_rank, leg_end_key, leg_end_ns = rank, STEP_END, t
    tolerances: Dict[int, int] = {}
    while True:
        index = indexes[rank]
        tolerance = tolerances.get(rank)
        if tolerance is None:
            tolerance = tolerances[rank] = overlap_tolerance(step.ranks[rank])
        node, running = index.last_before(t, tolerance)
        if node is None:
            break
        if running:
            add(rank, node.start_ns, t, _NODE_CATEGORY[node.category], node.name, node.span_id)
            t = node.start_ns
            continue
        if node.end_ns > t:  # a sync ending within the tolerance after t: it ends at t
            path.overlaps += 1
        else:
            add_gap(rank, node.end_ns, t)
            t = node.end_ns
        at_sync = sync_key(node)
        members = syncs.get(at_sync) if at_sync else None
        if not members or at_sync is None:
            category = _NODE_CATEGORY.get(node.category, PATH_COMMUNICATION)
            add(rank, node.start_ns, t, category, node.name, node.span_id)
            t = node.start_ns
            continue
        # a sync point: close the leg that starts when this sync completes on this rank
        legs.append(Leg(leg_rank, at_sync, leg_end_key, t, leg_end_ns))
        source, known_at = (
            last_arrival(members, rank, step, at_sync in hidden)
            if node.category == COLLECTIVE
            else (None, None)
        )
        if source is None:  # transfer: wait for the peer that started last
            source = max(members, key=lambda r: (members[r].start_ns, r == rank, -r))
        if known_at is not None:  # nobody to blame: waiting for a rank we cannot name
            arrival = min(known_at, t)
            path.unattributed_waits += 1
        else:
            arrival = min(members[source].start_ns, t) if source != rank else node.start_ns
        wait_end = arrival
        if known_at is not None:  # until the last rank was ready (the hidden ranks' starts)
            wait_end = min(t, max(arrival, max(s.start_ns for s in members.values())))
        elif waits_for_unseen_rank(node, members, expected):
            wait_end = min(t, max(arrival, collective_wait_end(node, step.ranks[rank])))
        add(rank, wait_end, t, PATH_COMMUNICATION, node.name, node.span_id)
        add(rank, arrival, wait_end, PATH_STRAGGLER_WAIT, node.name, node.span_id)
        rank, t = source, arrival
        leg_rank, leg_end_key, leg_end_ns = rank, at_sync, t
    path.concurrent = sum(len(index.concurrent) for index in indexes.values())
    first = min(step.ranks[rank].start_ns, t)
    add_gap(rank, first, t)
    # until its previous step's last collective ended the rank was still communicating (a
    # carry from the previous step span's end: what it was doing is not known, before_step)
    carry = carried.get(rank)
    if carry is not None and not carry.collective:
        carry = None
    still_in = min(first, carry.end_ns) if carry is not None else step.start_ns
    add(rank, max(step.start_ns, still_in), first, PATH_BEFORE_STEP, "(before rank's step)")
    if carry is not None:
        name = CARRIED_NAME + carry.name
        add(rank, step.start_ns, still_in, PATH_COMMUNICATION, name, carry.span_id)
    legs.append(Leg(leg_rank, STEP_START, leg_end_key, step.start_ns, leg_end_ns))
    path.segments = backward[::-1]
    path.legs = legs[::-1]
    _compare_legs(path.legs, step, syncs, hidden, carried)
    return path


def overlap_tolerance(timeline: RankTimeline) -> int:
    """How far a sync span may end after the next op of its rank began and still be that op's
    predecessor: ``OVERLAP_FLOOR_NS`` plus the rank's clock uncertainty (its step span's)."""
    span = timeline.step_span
    uncertainty = span.attributes.get(ATTR_CLOCK_UNCERTAINTY) if span is not None else None
    try:
        extra = max(0, int(uncertainty)) if uncertainty is not None else 0
    except (TypeError, ValueError):
        extra = 0
    return OVERLAP_FLOOR_NS + extra


def _inherited(carried: Dict[int, Carry], rank: int) -> int:
    carry = carried.get(rank)
    return carry.inherited_ns if carry is not None else 0


def _has_op_spans(step: StepTrace) -> bool:
    return any(s.category == COMPUTE for t in step.ranks.values() for s in t.nodes)


def _implicit_sync_path(path: CriticalPath, carried: Dict[int, Carry]) -> CriticalPath:
    """Several ranks, no collective or transfer spans (TF_OTEL_HOROVOD=0, a lost timeline): the
    ranks still synchronised somewhere in the step, unseen. Each rank is taken as ready once its
    last known own work ended (its input; else its step start); the rank ready last carries the
    path up to there, the rank that ended last the rest (the unseen sync and the work after it,
    its step work). The one leg, step start -> ready, starts after what each rank inherited
    from its previous step (``carried``); the path itself books no communication in a step
    that measured none (its late start stays ``before_step``)."""
    step = path.step
    ready = {rank: known_before(t, t.end_ns) for rank, t in step.ranks.items()}
    source = min(ready, key=lambda r: (-ready[r], r))
    sync = ready[source]
    last_end = max(t.end_ns for t in step.ranks.values())
    finisher = min(r for r, t in step.ranks.items() if t.end_ns == last_end)
    timeline = step.ranks[source]
    segments: List[Segment] = []
    first = min(timeline.start_ns, sync)
    if first > step.start_ns:
        segments.append(
            Segment(source, step.start_ns, first, PATH_BEFORE_STEP, "(before rank's step)")
        )
    t = first
    for span in sorted(timeline.nodes, key=attrgetter("start_ns", "span_id")):
        if span.category == COLLECTIVE or span.end_ns > sync or span.end_ns <= t:
            continue
        if span.start_ns > t:
            segments.append(Segment(source, t, span.start_ns, PATH_COMPUTE, STEP_WORK))
        category = _NODE_CATEGORY.get(span.category, PATH_COMMUNICATION)
        segments.append(
            Segment(source, max(t, span.start_ns), span.end_ns, category, span.name, span.span_id)
        )
        t = span.end_ns
    if last_end > t:
        name = STEP_WORK + " (no collective spans)"
        segments.append(Segment(finisher, t, last_end, PATH_COMPUTE, name))
    if step.end_ns > last_end:
        segments.append(
            Segment(finisher, last_end, step.end_ns, PATH_FRAMEWORK, "(after last rank)")
        )
    path.segments = segments
    leg = Leg(source, STEP_START, READY, step.start_ns, sync)
    leg.inherited_ns = _inherited(carried, source)
    others, waited = [], []
    for rank, value in ready.items():
        begin = step.start_ns + _inherited(carried, rank)
        leg.windows[rank] = (min(begin, max(step.start_ns, value)), max(step.start_ns, value))
        if rank != source:
            others.append(max(0, value - begin))
            waited.append(max(0, value - step.start_ns))
    _set_others(leg, others, waited)
    path.legs = [leg]
    return path


def _set_others(leg: Leg, others: List[int], waited: List[int]) -> None:
    """The other ranks' same leg: ``others`` less what each inherited, ``waited`` as is."""
    if others:
        leg.median_other_ns = int(statistics.median(others))
        leg.slowest_other_ns = max(others)
        if waited != others:
            leg.waited_other_ns = (int(statistics.median(waited)), max(waited))


def _compare_legs(
    legs: List[Leg],
    step: StepTrace,
    syncs: Dict[SyncKey, Dict[int, Span]],
    hidden: Set[SyncKey],
    carried: Dict[int, Carry],
) -> None:
    """Every rank's same leg; a first leg begins after what each rank inherited (``carry``)."""
    step_start = step.start_ns
    for leg in legs:
        first = leg.begin == STEP_START
        if first:
            leg.inherited_ns = _inherited(carried, leg.rank)
        own_start = min(leg.start_ns + leg.inherited_ns, max(leg.start_ns, leg.end_ns))
        own_rank = leg.rank
        windows = leg.windows
        windows[own_rank] = (own_start, leg.end_ns)
        others: List[int] = []
        waited: List[int] = []  # the same, nothing inherited taken off
        # loop invariants: the members of the leg's two ends, each looked up once a leg
        begins = None if first else syncs.get(leg.begin, {})
        ends = None if leg.end == STEP_END else syncs.get(leg.end, {})
        estimated: Optional[Dict[int, int]] = None
        if ends is not None and leg.end in hidden:
            estimated = estimated_arrivals(ends, step)
        for rank, timeline in step.ranks.items():
            if rank == own_rank:
                continue
            if begins is None:
                begin: Optional[int] = step_start + _inherited(carried, rank)
            else:
                member = begins.get(rank)
                begin = member.end_ns if member else None
            if ends is None:
                end: Optional[int] = timeline.end_ns
            else:
                member = ends.get(rank)
                end = member.start_ns if member else None
                if estimated is not None and member is not None and arrival_hidden(member):
                    end = estimated[rank]
            if begin is not None and end is not None:
                # a first leg's wall-clock length, from the step's start
                length = end - (step_start if first else begin)
                waited.append(length if length > 0 else 0)
                if end < begin:
                    end = begin  # overlapping collectives: this rank waited anyway
                windows[rank] = (begin, end)
                others.append(end - begin)
        _set_others(leg, others, waited)
