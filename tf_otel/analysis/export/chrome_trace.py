"""Steps as a Chrome trace-event document (the JSON that ui.perfetto.dev and chrome://tracing open).

Usage::

    document, stats = build_trace(steps, attributes)   # steps: ``steps.StepTrace``s
    json.dump(document, handle)

Layout: every rank is a process ("rank N @ host", sorted by rank) with one thread (track) per
span category, and the step roots are a process of their own on top. Spans are complete events
(``ph: X``) at their clock-corrected times; ``ts``/``dur`` are microseconds with three decimals.

A track only holds properly nested slices (the viewers drop or mis-nest the rest), so spans of
one category that overlap without nesting go to extra lanes ("compute (ops) 2", ...); nesting
is checked on the nanoseconds Perfetto will compute from the written numbers (``_parsed_ns``),
so rounding cannot break it.

Collectives are flows between ranks: an arrow from each waiting rank's ``collective.wait`` (else
its collective) to the collective of the rank that arrived last. They are v1 flow events placed
strictly inside their slices; a viewer binds a flow only when its start comes first, so one
that would start after its end once clocks are corrected gets no arrow (``flows_skipped``).

Arguments (``args``) are the span's attributes and its ids, less keys that look like secrets
(other instrumentations' spans may carry headers). More: docs/guides/ANALYSIS.md ("Perfetto /
Chrome trace export").
"""

from __future__ import annotations

import bisect
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tf_otel.analysis.model import ATTR_LAST_ARRIVAL, Span
from tf_otel.analysis.steps import StepTrace
from tf_otel.record import (
    ATTR_COLLECTIVE_KEY,
    ATTR_HOST_NAME,
    ATTR_TENSOR,
    COLLECTIVE,
    COLLECTIVE_TRANSFER,
    COLLECTIVE_WAIT,
    COMPUTE,
    INPUT,
    JOB,
    KERNEL,
    STEP,
    STEP_ROOT,
    TRANSFER,
)

# (track index, track name) per category; everything else is "other"
TRACKS: Dict[str, Tuple[int, str]] = {
    STEP: (0, "step"),
    INPUT: (1, "input"),
    COMPUTE: (2, "compute (ops)"),
    COLLECTIVE: (3, "collectives"),
    COLLECTIVE_WAIT: (4, "collective wait"),
    COLLECTIVE_TRANSFER: (5, "collective transfer"),
    TRANSFER: (6, "transfers"),
    KERNEL: (7, "nccl / gpu kernels"),
}
OTHER_TRACK = (8, "other")
ROOT_PID = 1_000_000  # the "all ranks" process; ranks are pid rank + 1 (pid 0 is the idle task)
_LANE_STRIDE = 1000  # tid = pid * 100000 + track * 1000 + lane: unique across processes
# Perfetto keeps a tid below 2**32 (a larger one falls back to the process's main thread, merging
# lanes): the all-ranks process numbers its lanes 1 + lane, below every rank's tids.
_SENSITIVE = re.compile(
    r"passw|secret|token|credential|authori[sz]ation|cookie|api[_.-]?key|private[_.-]?key",
    re.IGNORECASE,
)


def is_sensitive(key: str) -> bool:
    return bool(_SENSITIVE.search(key))


def _us(ns: int) -> float:
    """Nanoseconds as microseconds (the trace-event unit); repr keeps every digit it can."""
    return ns / 1000


def _parsed_ns(us: float) -> int:
    """The ns Perfetto's JSON importer makes of a written µs number (measured on its trace
    processor, v52): an integral double times 1000 exactly, else ``llround(us * 1000.0)``."""
    if us.is_integer():
        return int(us) * 1000
    scaled = us * 1000.0
    floor = math.floor(scaled)
    return int(floor) + (1 if scaled - floor >= 0.5 else 0)  # half away from zero: us >= 0


def perfetto_ns(start_ns: int, end_ns: int) -> Tuple[int, int]:
    """The (start, end) in ns that Perfetto computes from the written ``ts``/``dur``."""
    start = _parsed_ns(_us(start_ns))
    return start, start + _parsed_ns(_us(end_ns - start_ns))


@dataclass
class ExportStats:
    steps: int = 0
    ranks: int = 0
    slices: int = 0
    flows: int = 0
    flows_skipped: int = 0
    unranked: int = 0
    lanes: Dict[Tuple[int, str], int] = field(default_factory=dict)  # (rank, track) -> lanes


class _Lanes:
    """Lanes of one track: each a stack of open (start, end), properly nested."""

    def __init__(self) -> None:
        self.stacks: List[List[Tuple[int, int]]] = []

    def place(self, start: int, end: int) -> int:
        for lane, stack in enumerate(self.stacks):
            while stack and stack[-1][1] <= start:
                stack.pop()
            # strictly inside: a same-start pair's order would be up to the viewer's sort
            if not stack or (stack[-1][0] < start and stack[-1][1] >= end):
                stack.append((start, end))
                return lane
        self.stacks.append([(start, end)])
        return len(self.stacks) - 1


def _metadata(name: str, pid: int, tid: Optional[int], value: Any) -> Dict[str, Any]:
    event: Dict[str, Any] = {"ph": "M", "name": name, "pid": pid, "args": {}}
    if tid is not None:
        event["tid"] = tid
    key = "sort_index" if name.endswith("sort_index") else "name"
    event["args"][key] = value
    return event


def _args(span: Span, attributes: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    source = attributes if attributes is not None else span.attributes
    args = {key: value for key, value in source.items() if not is_sensitive(key)}
    args["trace_id"] = span.trace_id
    args["span_id"] = span.span_id
    if span.parent_id:
        args["parent_span_id"] = span.parent_id
    return args


def _collective_groups(step: StepTrace, attrs: Dict[Tuple[str, str], Dict[str, Any]]):
    """One collective instance's spans (one per rank) per key, and each span's children."""
    children: Dict[str, List[Span]] = defaultdict(list)
    per_rank: Dict[int, List[Span]] = defaultdict(list)
    for span in step.spans:
        if span.category in (COLLECTIVE_WAIT, COLLECTIVE_TRANSFER) and span.parent_id:
            children[span.parent_id].append(span)
        elif span.category == COLLECTIVE and span.rank is not None:
            per_rank[span.rank].append(span)
    groups: Dict[str, Dict[int, Span]] = defaultdict(dict)
    for rank, spans in per_rank.items():
        seen: Dict[str, int] = defaultdict(int)
        for span in sorted(spans, key=lambda s: (s.start_ns, s.span_id)):
            key = span.attributes.get(ATTR_COLLECTIVE_KEY)
            if key is None:  # no join key: the tensor name and its occurrence in the step
                full = attrs.get((span.trace_id, span.span_id)) or span.attributes
                tensor = str(full.get(ATTR_TENSOR) or span.name)
                key = f"{tensor}#{seen[tensor]}"
                seen[tensor] += 1
            groups[str(key)].setdefault(rank, span)
    return groups, children


Pair = Tuple[Span, Span]  # (a waiting rank's wait or collective, the last arrival's collective)


def _plan_flows(
    steps: Sequence[StepTrace], attrs: Dict[Tuple[str, str], Dict[str, Any]]
) -> List[Pair]:
    """Per collective instance on several ranks: each other rank's wait -> the last arrival."""
    pairs: List[Pair] = []
    for step in steps:
        groups, children = _collective_groups(step, attrs)
        for key in sorted(groups):
            by_rank = groups[key]
            if len(by_rank) < 2:
                continue
            marked = [s for s in by_rank.values() if s.attributes.get(ATTR_LAST_ARRIVAL) is True]
            if marked:
                last = marked[0]
            else:
                last = max(by_rank.values(), key=lambda s: (s.start_ns, -(s.rank or 0)))
            for rank in sorted(by_rank):
                span = by_rank[rank]
                if span is last:
                    continue
                waits = [k for k in children.get(span.span_id, ()) if k.category == COLLECTIVE_WAIT]
                source = max(waits, key=lambda s: s.duration_ns) if waits else span
                pairs.append((source, last))
    return pairs


def _flow_point(start: int, end: int, starts: List[int]) -> Optional[int]:
    """A Perfetto ns strictly inside (start, end) before any later slice on the thread starts
    (a flow event binds to the thread's innermost open slice), or None."""
    following = bisect.bisect_right(starts, start)
    limit = min(end, starts[following]) if following < len(starts) else end
    point = start + (limit - start) // 2
    while point > start:  # the written microseconds must parse back inside
        if start < _parsed_ns(_us(point)) < limit:
            return point
        point = start + (point - start) // 2
    return None


def _flow_events(
    pairs: List[Pair], where: Dict[str, Tuple[int, int, int, int]], stats: ExportStats
) -> List[Dict[str, Any]]:
    """v1 flow events (``s`` / ``f`` with ``bp: e``) for ``pairs``; ``where``: span id ->
    (pid, tid, Perfetto start, Perfetto end)."""
    starts: Dict[int, List[int]] = defaultdict(list)
    for _, tid, start, _ in where.values():
        starts[tid].append(start)
    for values in starts.values():
        values.sort()
    events: List[Dict[str, Any]] = []
    for number, (source, target) in enumerate(pairs, start=1):
        out_pid, out_tid, out_start, out_end = where[source.span_id]
        in_pid, in_tid, in_start, in_end = where[target.span_id]
        out_at = _flow_point(out_start, out_end, starts[out_tid])
        in_at = _flow_point(in_start, in_end, starts[in_tid])
        if out_at is None or in_at is None or _parsed_ns(_us(out_at)) >= _parsed_ns(_us(in_at)):
            stats.flows_skipped += 1  # too short, or the wait after the arrival: no arrow
            continue
        common = {"name": "collective", "cat": "collective.flow", "id": number}
        events.append({"ph": "s", "pid": out_pid, "tid": out_tid, "ts": _us(out_at), **common})
        events.append(
            {"ph": "f", "bp": "e", "pid": in_pid, "tid": in_tid, "ts": _us(in_at), **common}
        )
        stats.flows += 1
    return events


def _track(category: str) -> Tuple[int, str]:
    return TRACKS.get(category, OTHER_TRACK)


def build_trace(
    steps: Sequence[StepTrace],
    attributes: Optional[Dict[Tuple[str, str], Dict[str, Any]]] = None,
    other_data: Optional[Dict[str, Any]] = None,
) -> Tuple[Dict[str, Any], ExportStats]:
    """The trace-event document of ``steps``; ``attributes``: every attribute by (trace, span)
    id where the loader kept only some (``attributes.full_attributes``)."""
    attrs = attributes or {}
    stats = ExportStats(steps=len(steps))
    pairs = _plan_flows(steps, attrs)
    hosts: Dict[int, str] = {}
    placed: List[Tuple[int, int, int, int, Span]] = []  # (start, -end, pid, tid, span)
    spans: List[Span] = []
    for step in steps:
        for span in step.spans:
            if span.category == JOB:
                continue
            if span.category != STEP_ROOT and span.rank is None:
                stats.unranked += 1
                continue
            spans.append(span)
            if span.rank is not None and span.category != STEP_ROOT and span.rank not in hosts:
                hosts[span.rank] = str(span.resource.get(ATTR_HOST_NAME) or "?")
    spans.sort(key=lambda s: (s.start_ns, -s.end_ns, s.span_id))
    lanes: Dict[Tuple[int, int], _Lanes] = defaultdict(_Lanes)
    threads: Dict[int, Tuple[int, str, int]] = {}  # tid -> (pid, name, sort index)
    for span in spans:
        if span.category == STEP_ROOT:
            pid, (track, track_name) = ROOT_PID, (0, "steps (all ranks)")
        else:
            pid, (track, track_name) = span.rank + 1, _track(span.category)  # type: ignore[operator]
        start, end = perfetto_ns(span.start_ns, span.end_ns)
        lane = lanes[(pid, track)].place(start, end)
        if pid == ROOT_PID:
            tid = 1 + lane
        else:
            tid = pid * 100 * _LANE_STRIDE + track * _LANE_STRIDE + lane
        if tid not in threads:
            name = track_name if lane == 0 else f"{track_name} {lane + 1}"
            threads[tid] = (pid, name, track * _LANE_STRIDE + lane)
        placed.append((start, -end, pid, tid, span))
    events: List[Dict[str, Any]] = []
    if any(pid == ROOT_PID for _, _, pid, _, _ in placed):
        events.append(_metadata("process_name", ROOT_PID, None, "all ranks (step roots)"))
        events.append(_metadata("process_sort_index", ROOT_PID, None, -1))
    for rank in sorted(hosts):
        events.append(_metadata("process_name", rank + 1, None, f"rank {rank} @ {hosts[rank]}"))
        events.append(_metadata("process_sort_index", rank + 1, None, rank))
    for tid, (pid, name, order) in sorted(threads.items()):
        events.append(_metadata("thread_name", pid, tid, name))
        events.append(_metadata("thread_sort_index", pid, tid, order))
    for _, _, pid, tid, span in placed:
        event: Dict[str, Any] = {
            "ph": "X",
            "name": span.name or span.category or "span",
            "cat": span.category or "other",
            "pid": pid,
            "tid": tid,
            "ts": _us(span.start_ns),
            "dur": _us(span.end_ns - span.start_ns),
            "args": _args(span, attrs.get((span.trace_id, span.span_id))),
        }
        events.append(event)
    where = {span.span_id: (pid, tid, start, -neg_end) for start, neg_end, pid, tid, span in placed}
    events.extend(_flow_events(pairs, where, stats))
    stats.ranks = len(hosts)
    stats.slices = len(placed)
    for (pid, track), lane_set in lanes.items():
        if len(lane_set.stacks) > 1:
            stats.lanes[(pid - 1, str(track))] = len(lane_set.stacks)
    document: Dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if other_data:
        document["otherData"] = other_data
    return document, stats
