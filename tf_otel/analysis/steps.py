"""Group spans into steps: one ``StepTrace`` per trace whose root is a ``step.root`` span.

Usage::

    steps, warnings = group_steps(spans)
    steps = select_steps(steps, step_range=(10, 20), start_ns=None, end_ns=None)

A trace whose root span was not exported (rank 0 died, sampling) is still a step when it holds
per-rank ``step`` spans; its extent is then theirs, and a warning says so.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass
from operator import attrgetter
from typing import (
    Any,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Optional,
    Protocol,
    Set,
    Tuple,
    TypeVar,
)

from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.model import Span, by_trace
from tf_otel.record import (
    ATTR_STEP_IN_FLIGHT,
    ATTR_STEP_WORLD_RANKS,
    ATTR_STEP_WORLD_SIZE,
    ATTR_WORLD_SIZE,
    COLLECTIVE,
    COLLECTIVE_TRANSFER,
    COLLECTIVE_WAIT,
    COMPUTE,
    INPUT,
    JOB,
    STALL,
    STEP,
    STEP_ROOT,
    TRANSFER,
)

# Spans that form a rank's timeline for the critical path; every other category (framework,
# kernel, unknown) only names the gaps between them.
TIMELINE_CATEGORIES = frozenset((COMPUTE, INPUT, COLLECTIVE, TRANSFER))
COLLECTIVE_PARTS = frozenset((COLLECTIVE_WAIT, COLLECTIVE_TRANSFER))
# a step with any of these synchronised its ranks (``carry.has_sync_spans``)
SYNC_CATEGORIES = frozenset((COLLECTIVE, COLLECTIVE_WAIT, COLLECTIVE_TRANSFER, TRANSFER))
# timeline spans where the path may change rank (``RankTimeline.syncs``)
SYNC_NODES = frozenset((COLLECTIVE, TRANSFER))
_TRACE_ID = attrgetter("trace_id")
_SPAN_ID = attrgetter("span_id")
Extent = Tuple[int, int, str]  # a node's start, end and category


class RestRead(Protocol):
    """Reads a rank's spans not read yet into its timeline (``RankTimeline.more``)."""

    def __call__(self, timeline: RankTimeline) -> None: ...

    def extents(self, timeline: RankTimeline) -> List[Extent]:
        """The timeline's nodes as ``Extent``s, in ``nodes``' order, the spans not made."""
        ...


class RankTimeline:
    """One rank's part of one step.

    ``nodes`` (its TIMELINE_CATEGORIES spans, not nested), ``fillers`` (framework, kernel,
    other) and ``parts`` (collective span id -> its wait/transfer children) of a step built from
    its skeleton (``skeleton_step``) are read when first asked for (``more``); ``syncs``, the
    nodes that are collectives or PS transfers, are always there."""

    __slots__ = (
        "rank",
        "start_ns",
        "end_ns",
        "step_span",
        "syncs",
        "more",
        "_nodes",
        "_fillers",
        "_parts",
    )

    def __init__(self, rank: int, start_ns: int, end_ns: int, step_span: Optional[Span]) -> None:
        self.rank = rank
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.step_span = step_span
        self.syncs: List[Span] = []  # collective and transfer nodes, in input order
        # reads the rest of the rank's spans into the lists below (a skeleton step's)
        self.more: Optional[RestRead] = None
        self._nodes: List[Span] = []
        self._fillers: List[Span] = []
        self._parts: Dict[str, List[Span]] = {}

    def _read(self) -> None:
        more, self.more = self.more, None
        if more is not None:
            try:
                more(self)
            except BaseException:
                self.more = more  # not read: asked again, it raises again
                raise

    @property
    def nodes(self) -> List[Span]:
        if self.more is not None:
            self._read()
        return self._nodes

    def extents(self) -> List[Extent]:
        """``nodes`` as ``Extent``s; a rest not read yet is read without making its spans (a
        straggler step splits every rank's time: the path visits a few)."""
        if self.more is not None:
            return self.more.extents(self)
        return [(span.start_ns, span.end_ns, span.category) for span in self._nodes]

    @property
    def fillers(self) -> List[Span]:
        if self.more is not None:
            self._read()
        return self._fillers

    @property
    def parts(self) -> Dict[str, List[Span]]:
        if self.more is not None:
            self._read()
        return self._parts

    def fill(self, nodes: List[Span], fillers: List[Span], parts: Dict[str, List[Span]]) -> None:
        """The rank's spans, read (``more``)."""
        self._nodes, self._fillers, self._parts = nodes, fillers, parts

    def drop_spans(self, kept: List[Span]) -> None:
        """Keep ``kept`` as the nodes; no fillers or parts (``StepTrace.slim``)."""
        self.more = None
        self._nodes = kept
        self.syncs = [s for s in kept if s.category in SYNC_NODES]
        self._fillers, self._parts = _NO_SPANS, _NO_PARTS

    def __reduce__(self) -> Tuple[Any, ...]:
        self._read()  # a pickled timeline holds its spans, not a way to read them
        state = (self.syncs, self._nodes, self._fillers, self._parts)
        return (_timeline, (self.rank, self.start_ns, self.end_ns, self.step_span, state))

    def __repr__(self) -> str:
        return f"RankTimeline(rank={self.rank}, {self.start_ns}..{self.end_ns})"


@dataclass
class StepTrace:
    trace_id: str
    step: Optional[int]
    job_id: Optional[str]
    root: Optional[Span]
    start_ns: int
    end_ns: int
    ranks: Dict[int, RankTimeline]
    world_size: Optional[int]
    spans: List[Span]  # a skeleton step's: its skeleton (the rest read per rank)
    # a skeleton step's: the categories of its other spans (and of some in ``spans``: the
    # union is what ``measured`` reads)
    other_categories: FrozenSet[str] = frozenset()
    whole: bool = False  # built from all its spans where it has a skeleton (``NeedSpans``)
    slimmed: bool = False  # ``slim``: spans dropped after the analysis
    stripped: bool = False  # ``strip``: no step reads its collectives any more
    # the root's ranks of the world that ran the step where they are not 0..n-1 (Horovod
    # Elastic: a process keeps its first rank when the survivors are renumbered)
    world_ranks: Optional[Tuple[int, ...]] = None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def expected_ranks(self) -> List[int]:
        if self.world_ranks:
            return list(self.world_ranks)
        if self.world_size and self.world_size >= len(self.ranks):
            return list(range(self.world_size))
        return sorted(self.ranks)

    @property
    def missing_ranks(self) -> List[int]:
        return [rank for rank in self.expected_ranks if rank not in self.ranks]

    def slim(self) -> None:
        """Drop the spans once the step is analysed; keep what later steps and the cross-step
        statistics read: the root, each rank's extent and step span, each rank's last
        collective (``carry.last_collectives``) and one sync span where there was any
        (``carry.has_sync_spans``), as copies without their resource (the source's spans are
        left as they are). A slim step has no op spans: it cannot be analysed again."""
        if self.slimmed:
            return
        trace_id = self.trace_id
        shared: Dict[Any, Any] = {}  # values its ranks repeat (category, step, job): one object
        self.root = _light(self.root, trace_id, shared) if self.root is not None else None
        kept: List[Span] = [self.root] if self.root is not None else []
        for timeline in self.ranks.values():
            last: Optional[Span] = None
            for span in timeline.syncs:
                if span.category == COLLECTIVE and (last is None or span.end_ns > last.end_ns):
                    last = span
            timeline.drop_spans([_light(last, trace_id, shared)] if last is not None else [])
            if timeline.step_span is not None:  # its attributes: the whole-step rules, GPU
                timeline.step_span = _light(timeline.step_span, trace_id, shared, True)
                kept.append(timeline.step_span)
            kept.extend(timeline.nodes)
        sync = next((s for s in self.spans if s.category in SYNC_CATEGORIES), None)
        if sync is not None and not any(k.span_id == sync.span_id for k in kept):
            kept.append(_light(sync, trace_id, shared))
        self.spans = kept
        self.slimmed = True

    def strip(self) -> None:
        """Drop a slim step's last collectives and sync span too, where its outline is kept
        apart (``analyze``: on disk) for the steps that carry from it: what stays, the root,
        extents and step spans, is what the statistics and reports read."""
        if not self.slimmed or self.stripped:
            return
        for timeline in self.ranks.values():
            timeline.drop_spans(_NO_SPANS)
        self.spans = [self.root] if self.root is not None else []
        self.spans.extend(t.step_span for t in self.ranks.values() if t.step_span is not None)
        self.stripped = True


def _timeline(
    rank: int, start_ns: int, end_ns: int, step_span: Optional[Span], state: Tuple[Any, ...]
) -> RankTimeline:
    """A timeline unpickled (``RankTimeline.__reduce__``)."""
    timeline = RankTimeline.__new__(RankTimeline)
    timeline.rank, timeline.start_ns, timeline.end_ns = rank, start_ns, end_ns
    timeline.step_span, timeline.more = step_span, None
    timeline.syncs, timeline._nodes, timeline._fillers, timeline._parts = state
    return timeline


_NEW = object.__new__
# shared by every slim step, which is read only: an empty list and dict a rank cost 120 bytes
_NOTHING: Dict[str, Any] = {}
_NO_SPANS: List[Span] = []
_NO_PARTS: Dict[str, List[Span]] = {}


def _light(
    span: Span, trace_id: str, shared: Dict[Any, Any], keep_attributes: bool = False
) -> Span:
    """A small copy of ``span`` for a slim step: its ids, name, times and slots; no parent,
    no resource, attributes only where asked (about 300 bytes instead of 1-2 KB). ``shared``:
    the step's values seen so far, so that its ranks share one category, step and job object
    (each rank's spans were decoded apart)."""
    light: Span = _NEW(Span)  # field by field: no row made and read back
    light.trace_id, light.span_id, light.parent_id = trace_id, span.span_id, None
    light.name = sys.intern(span.name)  # the same names step after step
    light.start_ns, light.end_ns = span.start_ns, span.end_ns
    light.attributes = span.attributes if keep_attributes and span.attributes else _NOTHING
    light.resource = _NOTHING
    light.category = shared.setdefault(span.category, span.category)
    light.rank = span.rank
    light.step = shared.setdefault(span.step, span.step)
    light.job_id = shared.setdefault(span.job_id, span.job_id)
    light.gpu_utilization = span.gpu_utilization
    return light


WORLD_SIZE_SPANS = 64  # the spans read after the root


def world_size_of(
    root: Optional[Span],
    spans: List[Span],
    names: Tuple[str, ...] = (ATTR_STEP_WORLD_SIZE, ATTR_WORLD_SIZE),
) -> Optional[int]:
    """How many ranks should have spans in a step: the ranks that run steps where the runtime
    says (a parameter-server job's ps tasks run none), else the job's world size."""
    for name in names:
        for span in ([root] if root else []) + spans[:WORLD_SIZE_SPANS]:
            for source in (span.attributes, span.resource):
                value = source.get(name)
                if value is not None:
                    try:
                        return int(value)
                    except (TypeError, ValueError):
                        continue
    return None


def world_ranks_of(root: Optional[Span]) -> Optional[Tuple[int, ...]]:
    """The ranks of the world that ran the step, where its root names them (they are not
    0..n-1: ``tf_otel.step.world_ranks``); None otherwise."""
    value = root.attributes.get(ATTR_STEP_WORLD_RANKS) if root is not None else None
    if not isinstance(value, (list, tuple)) or not value:
        return None
    try:
        return tuple(sorted({int(rank) for rank in value}))
    except (TypeError, ValueError):
        return None


def roots_and_step_spans(spans: List[Span]) -> Tuple[List[Span], Dict[int, List[Span]]]:
    """The step's root spans, and each rank's step spans (those exported mid-step, a stall or
    an exit, only for a rank whose step never ended)."""
    roots = []
    step_spans: Dict[int, List[Span]] = defaultdict(list)
    in_flight: Dict[int, List[Span]] = defaultdict(list)
    for span in spans:
        category = span.category
        if category == STEP:
            if span.rank is not None:
                if span.attributes.get(ATTR_STEP_IN_FLIGHT):
                    in_flight[span.rank].append(span)
                else:
                    step_spans[span.rank].append(span)
        elif category == STEP_ROOT:
            roots.append(span)
    for owner, flights in in_flight.items():
        if owner not in step_spans:
            step_spans[owner] = flights
    return roots, step_spans


def unranked_warning(step_number: Optional[int], count: int) -> str:
    return f"step {step_number}: {count} spans without tf_otel.rank ignored"


def _build_step(trace_id: str, by_id: Dict[str, Span], warnings: List[str]) -> Optional[StepTrace]:
    """``by_id``: the trace's spans by span id, in input order."""
    spans = list(by_id.values())
    roots, step_spans = roots_and_step_spans(spans)
    root = min(roots, key=lambda s: (s.start_ns, s.span_id)) if roots else None
    if root is None and not step_spans:
        return None  # the job span's trace, or foreign spans
    step_number = root.step if root is not None else None
    if step_number is None:
        step_number = next((s.step for s in spans if s.step is not None), None)
    if root is None:
        warnings.append(f"step {step_number} (trace {trace_id}): no step.root span; using ranks")

    ranks: Dict[int, RankTimeline] = {}
    unranked = 0
    timeline_categories, collective_parts = TIMELINE_CATEGORIES, COLLECTIVE_PARTS
    sync_nodes = SYNC_NODES
    last_rank: Optional[int] = None  # spans come grouped by rank: reuse its timeline
    timeline: Optional[RankTimeline] = None
    nodes: List[Span] = []
    syncs: List[Span] = []
    fillers: List[Span] = []
    parts: Dict[str, List[Span]] = {}
    extent_from_spans = False
    for span in spans:
        category = span.category
        if category == STEP_ROOT or category == JOB or category == STALL:
            continue
        rank = span.rank
        if rank is None:
            unranked += 1
            continue
        if rank != last_rank or timeline is None:
            timeline = ranks.get(rank)
            if timeline is None:
                own = step_spans.get(rank)
                step_span = min(own, key=lambda s: s.start_ns) if own else None
                timeline = RankTimeline(rank, span.start_ns, span.end_ns, step_span)
                if own:
                    timeline.start_ns = min(s.start_ns for s in own)
                    timeline.end_ns = max(s.end_ns for s in own)
                ranks[rank] = timeline
            last_rank, nodes, fillers = rank, timeline.nodes, timeline.fillers
            parts, syncs = timeline.parts, timeline.syncs
            extent_from_spans = not timeline.step_span  # no step span: the spans' extent
        if category == STEP:
            continue
        if extent_from_spans:
            timeline.start_ns = min(timeline.start_ns, span.start_ns)
            timeline.end_ns = max(timeline.end_ns, span.end_ns)
        if category in timeline_categories:
            parent = by_id.get(span.parent_id) if span.parent_id else None
            if parent is None or parent.category not in timeline_categories:
                nodes.append(span)
                if category in sync_nodes:
                    syncs.append(span)
        elif category in collective_parts and span.parent_id:
            parts.setdefault(span.parent_id, []).append(span)
        else:
            fillers.append(span)
    if unranked:
        warnings.append(unranked_warning(step_number, unranked))
    if not ranks:
        return None
    start = root.start_ns if root else min(t.start_ns for t in ranks.values())
    end = root.end_ns if root else max(t.end_ns for t in ranks.values())
    start = min([start] + [t.start_ns for t in ranks.values()])
    end = max([end] + [t.end_ns for t in ranks.values()])
    job_id = root.job_id if root else next((s.job_id for s in spans if s.job_id), None)
    trace = StepTrace(
        trace_id, step_number, job_id, root, start, end, ranks, world_size_of(root, spans), spans
    )
    trace.world_ranks = world_ranks_of(root)
    return trace


def spans_by_trace(spans: Iterable[Span]) -> Dict[str, List[Span]]:
    """Each trace's spans in input order (duplicates kept)."""
    return by_trace(spans, _TRACE_ID)


def _unique_by_id(spans: List[Span]) -> Dict[str, Span]:
    """Span id -> span in input order; the first of duplicates (same span id) wins."""
    by_id = dict(zip(map(_SPAN_ID, spans), spans))
    if len(by_id) == len(spans):
        return by_id
    by_id = {}
    for span in spans:
        by_id.setdefault(span.span_id, span)
    return by_id


def build_step(trace_id: str, spans: List[Span], warnings: List[str]) -> Optional[StepTrace]:
    """One trace's step (None: not a step); duplicate spans (same span id) dropped."""
    return _build_step(trace_id, _unique_by_id(spans), warnings)


class Ordered(Protocol):
    """A step, or what is kept of one (``carry.StepKey``): enough to order and select it."""

    @property
    def trace_id(self) -> str: ...

    @property
    def step(self) -> Optional[int]: ...

    @property
    def start_ns(self) -> int: ...


StepLike = TypeVar("StepLike", bound=Ordered)


def step_order(step: Ordered) -> Tuple[int, int, str]:
    """Steps sort by step number, then start, then trace id."""
    return (step.step if step.step is not None else -1, step.start_ns, step.trace_id)


def group_steps(spans: Iterable[Span]) -> Tuple[List[StepTrace], List[str]]:
    """Steps ordered by (step number, start); duplicate spans (same trace+span id) dropped."""
    return group_trace_steps(spans_by_trace(spans))


def group_trace_steps(traces: Dict[str, List[Span]]) -> Tuple[List[StepTrace], List[str]]:
    """``group_steps`` on spans already split by trace (``spans_by_trace``)."""
    warnings: List[str] = []
    steps = []
    for trace_id in sorted(traces):
        step = build_step(trace_id, traces[trace_id], warnings)
        if step is not None:
            steps.append(step)
    steps.sort(key=step_order)
    return steps, warnings


def job_ids(spans: Iterable[Span]) -> Set[str]:
    jobs = set(map(attrgetter("job_id"), spans))
    jobs.discard(None)
    return jobs


def parse_step_range(text: str) -> Tuple[Optional[int], Optional[int]]:
    """'7' -> (7, 7); '10:20' or '10-20' -> (10, 20) inclusive; '10:' -> (10, None)."""
    for separator in (":", "-"):
        if separator in text.strip().lstrip("-"):
            low, high = text.split(separator, 1)
            try:
                return (int(low) if low.strip() else None, int(high) if high.strip() else None)
            except ValueError:
                break
    try:
        return int(text), int(text)
    except ValueError:
        raise AnalysisError(f"bad step range {text!r} (use N, A:B, A: or :B)") from None


def select_steps(
    steps: List[StepLike],
    step_range: Optional[Tuple[Optional[int], Optional[int]]] = None,
    start_ns: Optional[int] = None,
    end_ns: Optional[int] = None,
) -> List[StepLike]:
    selected = []
    for step in steps:
        if step_range is not None:
            low, high = step_range
            if step.step is None:
                continue
            if (low is not None and step.step < low) or (high is not None and step.step > high):
                continue
        if start_ns is not None and step.start_ns < start_ns:
            continue
        if end_ns is not None and step.start_ns >= end_ns:
            continue
        selected.append(step)
    return selected
