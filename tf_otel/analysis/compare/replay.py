"""A step's dependency graph, replayed with some ranks' excess work taken off: the what-if.

Usage::

    own_work(step, inherited={1: ns})             # every rank's own work, kept of every step
    graph = step_graph(step, inherited={1: ns})   # the step read again with its sync spans
    graph.work                                     # rank -> its own work in the step (ns)
    graph.saving([3])                              # ns the step saves without rank 3's excess

The graph: on each rank its sync spans (collectives by ``tf_otel.collective.key``, PS / pipeline
transfers by ``tensorflow.transfer.edge``) in start order. A rank arrives at a sync after its
own work since its predecessor, the last of its syncs that ended by then (within the overlap
tolerance, ``critical_path.overlap_tolerance``), or since the step's start plus what it
inherited from its previous step; a sync completes on each member when its last member has
arrived plus what that member spent in it after the last arrival (the transfer itself); the
rank's step ends after its own work since its last sync. Replaying the graph with a rank's
excess work taken off (``StepGraph.without``) answers "how much shorter had it been no slower
than the others". The saving is the
replay of the graph as recorded minus the replay as changed, so what the graph does not model
(work inside a sync, a hidden arrival's estimate) cancels out.

A rank's work is what it did outside its syncs: its first arrival after the step's start (less
what it inherited), the gaps between its syncs and its tail; where its syncs overlap, only the
time outside all of them.
"""

from __future__ import annotations

import bisect
import statistics
from array import array
from dataclasses import dataclass
from operator import attrgetter
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from tf_otel.analysis.model import Span
from tf_otel.analysis.path.critical_path import overlap_tolerance
from tf_otel.analysis.path.sync_points import SyncKey, arrival_hidden, estimated_arrivals, sync_key
from tf_otel.analysis.steps import StepTrace

_EXTENT = attrgetter("start_ns", "end_ns")
_FIELDS = 5  # an event: rank, work ns, predecessor event (-1: the step start), post ns, sync


@dataclass
class StepGraph:
    """One step's syncs and each rank's own work between them (``step_graph``)."""

    start_ns: int
    ranks: array  # the ranks, in order
    base_ns: array  # per rank (by position): when its own work may begin (start + inherited)
    # events grouped by sync, the syncs in an order that respects the dependencies; per event
    # _FIELDS values: rank position, own work before it, predecessor event, post, sync index
    events: array
    tail_pred: array  # per rank: its last sync's event (-1: none)
    tail_ns: array  # per rank: its own work after it
    work_ns: array  # per rank: all its own work in the step

    @property
    def work(self) -> Dict[int, int]:
        return dict(zip(self.ranks, self.work_ns))

    def duration(self, ranks: Iterable[int] = ()) -> int:
        """The step's length replayed, ``ranks``' excess work taken off (``without``)."""
        work, tails = self.without(ranks)
        events = self.events
        count = len(events) // _FIELDS
        done = [0] * count  # each event's completion
        i = 0
        while i < count:
            sync = events[i * _FIELDS + 4]
            j = i
            latest = None
            while j < count and events[j * _FIELDS + 4] == sync:
                at = j * _FIELDS
                position, pred = events[at], events[at + 2]
                begin = done[pred] if 0 <= pred < i else self.base_ns[position]
                arrival = begin + work[j]
                done[j] = arrival  # the arrival for now; the completion below
                latest = arrival if latest is None or arrival > latest else latest
                j += 1
            for k in range(i, j):
                done[k] = latest + events[k * _FIELDS + 3]
            i = j
        end = self.start_ns
        for position in range(len(self.ranks)):
            pred = self.tail_pred[position]
            begin = done[pred] if pred >= 0 else self.base_ns[position]
            end = max(end, begin + tails[position])
        return end - self.start_ns

    def without(self, ranks: Iterable[int]) -> Tuple[List[int], List[int]]:
        """Each event's and each rank's tail work with ``ranks``' excess taken off: a piece of
        their work that other ranks did between the same two syncs (the same leg) is cut to
        those ranks' median; a piece no other rank shares (a pipeline stage's own transfers)
        is scaled by the rank's whole work over the other ranks' median (``scale_for``)."""
        events = self.events
        count = len(events) // _FIELDS
        work = [events[e * _FIELDS + 1] for e in range(count)]
        tails = list(self.tail_ns)
        chosen = {self.ranks.index(r) for r in ranks if r in self.ranks}
        if not chosen:
            return work, tails
        others = [w for p, w in enumerate(self.work_ns) if p not in chosen]
        typical_work = statistics.median(others) if others else 0

        def leg(e: int) -> Tuple[int, int]:
            pred = events[e * _FIELDS + 2]
            return (events[pred * _FIELDS + 4] if pred >= 0 else -1, events[e * _FIELDS + 4])

        def tail_leg(position: int) -> Tuple[int, int]:
            pred = self.tail_pred[position]
            return (events[pred * _FIELDS + 4] if pred >= 0 else -1, -2)

        shared: Dict[Tuple[int, int], List[int]] = {}
        for e in range(count):
            if events[e * _FIELDS] not in chosen:
                shared.setdefault(leg(e), []).append(work[e])
        for position in range(len(self.ranks)):
            if position not in chosen:
                shared.setdefault(tail_leg(position), []).append(tails[position])
        scale = {
            p: min(1.0, typical_work / self.work_ns[p]) if self.work_ns[p] > 0 else 1.0
            for p in chosen
        }

        def cut(value: int, same: Optional[List[int]], position: int) -> int:
            if same:
                return min(value, int(statistics.median(same)))
            return int(value * scale[position])

        for e in range(count):
            position = events[e * _FIELDS]
            if position in chosen:
                work[e] = cut(work[e], shared.get(leg(e)), position)
        for position in chosen:
            tails[position] = cut(tails[position], shared.get(tail_leg(position)), position)
        return work, tails

    def saving(self, ranks: Iterable[int]) -> int:
        """How much shorter the step had been without ``ranks``' excess work."""
        ranks = list(ranks)
        if not ranks:
            return 0
        return max(0, self.duration() - self.duration(ranks))


def step_graph(step: StepTrace, inherited: Optional[Mapping[int, int]] = None) -> StepGraph:
    """The graph of ``step`` (which still holds its sync spans); ``inherited``: rank -> what it
    carried in from its previous step (``carry``), not its own work."""
    inherited = inherited or {}
    ranks = sorted(step.ranks)
    position = {rank: i for i, rank in enumerate(ranks)}
    members: Dict[SyncKey, Dict[int, Span]] = {}
    for rank in ranks:
        for span in step.ranks[rank].syncs:
            key = sync_key(span)
            if key is not None:
                found = members.setdefault(key, {})
                if rank not in found or span.start_ns < found[rank].start_ns:
                    found[rank] = span
    # each sync's arrivals (estimated where Horovod's cache hid one) and last arrival
    arrivals: Dict[SyncKey, Dict[int, int]] = {}
    for key, spans in members.items():
        hidden = any(map(arrival_hidden, spans.values()))
        arrivals[key] = (
            estimated_arrivals(spans, step)
            if hidden
            else {rank: s.start_ns for rank, s in spans.items()}
        )
    base = array("q", (step.start_ns + max(0, inherited.get(r, 0)) for r in ranks))
    own: Dict[int, List[SyncKey]] = {}
    for key, spans in members.items():
        for rank in spans:
            own.setdefault(rank, []).append(key)
    preds: Dict[int, Dict[SyncKey, Optional[SyncKey]]] = {}
    work_before: Dict[int, Dict[SyncKey, int]] = {}
    tail_pred_key: Dict[int, Optional[SyncKey]] = {}
    tail = array("q", bytes(8 * len(ranks)))
    work = array("q", bytes(8 * len(ranks)))
    for rank in ranks:
        timeline = step.ranks[rank]
        keys = sorted(own.get(rank, ()), key=lambda k: members[k][rank].start_ns)
        tolerance = overlap_tolerance(timeline)
        ends: List[int] = []  # the syncs so far by end, for the predecessor search
        ended: List[SyncKey] = []
        pred_of: Dict[SyncKey, Optional[SyncKey]] = {}
        before: Dict[SyncKey, int] = {}
        rank_base = base[position[rank]]
        for key in keys:
            arrival = arrivals[key][rank]
            cut = bisect.bisect_right(ends, arrival + tolerance)
            pred = ended[cut - 1] if cut else None
            pred_of[key] = pred
            begin = members[pred][rank].end_ns if pred is not None else rank_base
            before[key] = max(0, arrival - begin)
            end = members[key][rank].end_ns
            at = bisect.bisect_right(ends, end)
            ends.insert(at, end)
            ended.insert(at, key)
        preds[rank], work_before[rank] = pred_of, before
        last = ended[-1] if ended else None
        tail_pred_key[rank] = last
        last_end = members[last][rank].end_ns if last is not None else rank_base
        tail[position[rank]] = max(0, timeline.end_ns - last_end)
        work[position[rank]] = _own_work(
            rank_base,
            timeline.end_ns,
            [(members[k][rank].start_ns, members[k][rank].end_ns) for k in keys],
        )
    order = _dependency_order(members, arrivals, preds)
    sync_index = {key: i for i, key in enumerate(order)}
    events = array("q")
    event_of: Dict[tuple, int] = {}
    for key in order:
        for rank in sorted(members[key]):
            event_of[(rank, key)] = len(events) // _FIELDS
            events.extend((position[rank], 0, -1, 0, sync_index[key]))
    for key in order:
        last_arrival = max(arrivals[key].values())
        for rank, span in members[key].items():
            at = event_of[(rank, key)] * _FIELDS
            pred = preds[rank][key]
            events[at + 1] = work_before[rank][key]
            events[at + 2] = event_of[(rank, pred)] if pred is not None else -1
            events[at + 3] = max(0, span.end_ns - last_arrival)
    tail_pred = array(
        "q",
        (event_of[(r, tail_pred_key[r])] if tail_pred_key[r] is not None else -1 for r in ranks),
    )
    return StepGraph(step.start_ns, array("q", ranks), base, events, tail_pred, tail, work)


def _dependency_order(
    members: Dict[SyncKey, Dict[int, Span]],
    arrivals: Dict[SyncKey, Dict[int, int]],
    preds: Dict[int, Dict[SyncKey, Optional[SyncKey]]],
) -> List[SyncKey]:
    """The syncs, each after the syncs its members' arrivals wait for (by last arrival where
    free to choose; a cycle, which only inconsistent times make, is cut where it closes)."""
    by_arrival = sorted(members, key=lambda k: (max(arrivals[k].values()), k))
    done: set = set()
    order: List[SyncKey] = []
    for first in by_arrival:
        stack = [first]
        while stack:
            key = stack[-1]
            if key in done:
                stack.pop()
                continue
            waiting = [
                pred
                for rank in members[key]
                if (pred := preds[rank][key]) is not None and pred not in done and pred not in stack
            ]
            if waiting:
                stack.append(waiting[0])
                continue
            stack.pop()
            done.add(key)
            order.append(key)
    return order


def own_work(step: StepTrace, inherited: Optional[Mapping[int, int]] = None) -> array:
    """Each rank's own work in ``step`` (which still holds its sync spans), by rank in sorted
    order: its time from the step's start (plus what it inherited) to its step's end outside
    its collective and transfer spans (keyed or not: a sync without a key is rare, and the
    graph's work, which reads keyed ones only, is not compared with this). Taken of every
    step; the graph is built only where the run is replayed."""
    inherited = inherited or {}
    start = step.start_ns
    out = array("q")
    for rank in sorted(step.ranks):
        timeline = step.ranks[rank]
        begin = start + max(0, inherited.get(rank, 0))
        out.append(_own_work(begin, timeline.end_ns, sorted(map(_EXTENT, timeline.syncs))))
    return out


def _own_work(begin: int, end: int, syncs: List[tuple]) -> int:
    """The time in [begin, end) outside every sync interval (``syncs`` sorted by start)."""
    busy = 0
    reached = begin
    for start, stop in syncs:
        start, stop = max(start, reached), min(stop, end)
        if stop > start:
            busy += stop - start
            reached = stop
    return max(0, end - begin - busy)
