"""Where a step's ranks meet: its sync points (a collective instance, a PS transfer) with each
rank's member span, which rank arrived last (Horovod's flag, else the latest start; estimated
where Horovod's response cache hid an arrival), and where a rank's wait inside a collective ends.

Usage::

    syncs = {**collective_index(step), **transfer_index(step)}   # SyncKey -> rank -> span
    rank, leave_at = last_arrival(syncs[key], current, step, key in hidden_syncs(syncs))
    arrivals = estimated_arrivals(syncs[key], step)               # rank -> arrival ns
"""

from __future__ import annotations

import statistics
from itertools import repeat
from operator import attrgetter
from typing import Dict, NamedTuple, Optional, Set, Tuple

from tf_otel.analysis.model import (
    ATTR_ARRIVAL,
    ATTR_LAST_ARRIVAL,
    ATTR_TRANSFER_EDGE,
    ATTR_WAIT_NS,
    Span,
)
from tf_otel.analysis.steps import RankTimeline, StepTrace
from tf_otel.record import ATTR_COLLECTIVE_KEY, COLLECTIVE, COLLECTIVE_WAIT, TRANSFER

UNKNOWN_ARRIVAL = "unknown"
UNEXPLAINED_MIN_NS = 1_000_000  # a hidden rank readier than the last known one by less: noise
_ATTRIBUTES = attrgetter("attributes")


class SyncKey(NamedTuple):
    """A point where the path may change rank: a collective instance (every rank's span with
    the same ``tf_otel.collective.key``) or a PS transfer (the peers' spans with the same
    ``tensorflow.transfer.edge``); ``STEP_EDGE`` marks the step's own edges."""

    kind: str  # COLLECTIVE or TRANSFER (the spans' category), or STEP_EDGE
    name: str  # the collective key / transfer edge as text; for STEP_EDGE which edge


# collective key -> rank -> its arrival (earliest span start), where every arrival is known
Arrivals = Dict[str, Dict[int, int]]

STEP_EDGE = "step"
STEP_START = SyncKey(STEP_EDGE, "start")
STEP_END = SyncKey(STEP_EDGE, "end")
READY = SyncKey(STEP_EDGE, "ready")  # where every rank was ready (no sync spans: unseen)


def sync_key(node: Span) -> Optional[SyncKey]:
    if node.category == COLLECTIVE:
        key = node.attributes.get(ATTR_COLLECTIVE_KEY)
        return None if key is None else SyncKey(COLLECTIVE, str(key))
    if node.category == TRANSFER:
        edge = node.attributes.get(ATTR_TRANSFER_EDGE)
        return None if edge is None else SyncKey(TRANSFER, str(edge))
    return None


def collective_index(step: StepTrace) -> Dict[SyncKey, Dict[int, Span]]:
    index: Dict[SyncKey, Dict[int, Span]] = {}
    # a collective's members by its key's text: every rank names the same collectives, so
    # each one's SyncKey is made once, not once a rank
    by_name: Dict[str, Dict[int, Span]] = {}
    for rank in sorted(step.ranks):
        for span in step.ranks[rank].syncs:
            if span.category != COLLECTIVE:
                continue
            key = span.attributes.get(ATTR_COLLECTIVE_KEY)
            if key is None:
                continue
            name = key if type(key) is str else str(key)
            members = by_name.get(name)
            if members is None:
                members = by_name[name] = index[SyncKey(COLLECTIVE, name)] = {}
            if rank not in members or span.start_ns < members[rank].start_ns:
                members[rank] = span
    return index


def transfer_index(step: StepTrace) -> Dict[SyncKey, Dict[int, Span]]:
    index: Dict[SyncKey, Dict[int, Span]] = {}
    for rank in sorted(step.ranks):
        for span in step.ranks[rank].syncs:
            edge = span.attributes.get(ATTR_TRANSFER_EDGE) if span.category == TRANSFER else None
            if edge is not None:
                index.setdefault(SyncKey(TRANSFER, str(edge)), {}).setdefault(rank, span)
    return index


def arrival_hidden(span: Span) -> bool:
    return span.attributes.get(ATTR_ARRIVAL) == UNKNOWN_ARRIVAL


def hidden_syncs(index: Dict[SyncKey, Dict[int, Span]]) -> Set[SyncKey]:
    """The sync points some of whose members' arrivals are unknown (hidden by Horovod's cache)."""
    # ``arrival_hidden`` at C speed: with nothing hidden every member of every collective is read
    return {
        key
        for key, members in index.items()
        if UNKNOWN_ARRIVAL
        in map(dict.get, map(_ATTRIBUTES, members.values()), repeat(ATTR_ARRIVAL))
    }


def known_before(timeline: RankTimeline, t: int) -> int:
    """The last moment before ``t`` this rank is known to have been busy with its own work:
    the latest end of its non-collective spans ending by ``t``, else its step's start."""
    known = timeline.start_ns
    for span in timeline.nodes:
        if span.category != COLLECTIVE and known < span.end_ns <= t:
            known = span.end_ns
    return min(known, t)


def estimated_arrivals(members: Dict[int, Span], step: StepTrace) -> Dict[int, int]:
    """Each member's arrival: the span start where known; for a rank whose arrival Horovod's
    cache hid, the end of its last own work plus the work the known ranks did after theirs
    (the ranks run the same step), never after its span start (the last rank's readiness)."""
    after = [
        span.start_ns - known_before(step.ranks[rank], span.start_ns)
        for rank, span in members.items()
        if not arrival_hidden(span) and rank in step.ranks
    ]
    typical = int(statistics.median(after)) if after else 0
    return {
        rank: (
            min(span.start_ns, known_before(step.ranks[rank], span.start_ns) + typical)
            if arrival_hidden(span) and rank in step.ranks
            else span.start_ns
        )
        for rank, span in members.items()
    }


def _unknown_last_arrival(
    members: Dict[int, Span], current: int, step: StepTrace
) -> Tuple[int, Optional[int]]:
    """Horovod's response cache hid some ranks' arrivals: their spans start when the last rank
    became ready. Each rank's latest known moment: its arrival where known, else the end of its
    last own work. The rank furthest ahead is blamed when its lead explains at least half of
    the wait; else nobody is (the rest of the wait stays on the collective, as communication):
    returns (rank, the time the path leaves the collective for it, None: its span start)."""
    fake = max(span.start_ns for span in members.values() if arrival_hidden(span))
    latest = estimated_arrivals(members, step)
    top = max(latest, key=lambda r: (latest[r], r == current, -r))
    if not arrival_hidden(members[top]):
        # a known arrival last of all; a hidden rank became ready clearly later: nobody known
        return top, (latest[top] if fake - latest[top] > UNEXPLAINED_MIN_NS else None)
    second = max((v for r, v in latest.items() if r != top), default=latest[top])
    gap = fake - second
    if gap <= 0 or 2 * (latest[top] - second) >= gap:
        return top, None
    return top, latest[top]


def last_arrival(
    members: Dict[int, Span], current: int, step: StepTrace, hidden: bool
) -> Tuple[int, Optional[int]]:
    """``hidden``: some member's arrival is unknown."""
    flagged = [
        rank for rank, span in members.items() if span.attributes.get(ATTR_LAST_ARRIVAL) is True
    ]
    if len(flagged) == 1:
        return flagged[0], None
    if hidden:
        return _unknown_last_arrival(members, current, step)
    latest = max(span.start_ns for span in members.values())
    tied = [rank for rank, span in members.items() if span.start_ns == latest]
    return (current if current in tied else min(tied)), None


def waits_for_unseen_rank(node: Span, members: Dict[int, Span], expected: set) -> bool:
    """A collective some expected rank has no span for, and no seen rank says it came last."""
    if node.category != COLLECTIVE or expected.issubset(members):
        return False
    return not any(s.attributes.get(ATTR_LAST_ARRIVAL) is True for s in members.values())


def collective_wait_end(span: Span, timeline: RankTimeline) -> int:
    """Where this rank's waiting inside a collective ends (wait child, horovod.wait_ns)."""
    waits = [p for p in timeline.parts.get(span.span_id, ()) if p.category == COLLECTIVE_WAIT]
    if waits:
        return min(span.end_ns, max(p.end_ns for p in waits))
    wait_ns = span.attributes.get(ATTR_WAIT_NS)
    if wait_ns is not None:
        try:
            return min(span.end_ns, span.start_ns + max(0, int(wait_ns)))
        except (TypeError, ValueError):
            pass
    if span.attributes.get(ATTR_LAST_ARRIVAL) is False:
        return span.end_ns
    return span.start_ns
