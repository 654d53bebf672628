"""A step's skeleton: the few spans that decide its outline and where its path changes rank.

Usage::

    head, rest = split_rows(rows)                    # the spill: one trace's rows of a block
    rows = joined_rows(marshal.loads(head_blob), rest)   # all of them again, in input order
    step = skeleton_step(trace_id, source.skeleton(trace_id), warnings)
    # NeedSpans: build the step from all its spans (``steps.build_step``) instead

The spill (``load.spill``) writes each piece of a trace in two parts: its skeleton (step, root,
job, stall, collective and PS transfer spans; spans without a rank or with a GPU sample; each
rank's first span and the first span of a sync category: one span in twelve on the bench's
traces) and the rest (op, input, framework and kernel spans, collective parts). The first pass
(outlines) reads skeletons only. In the second, a rank's rest is read when the path or a rule
first asks for its op spans (``RankTimeline.more``): the path visits a few ranks of a step.

A skeleton step is the step ``steps.build_step`` makes of all the spans, or none is made:
``NeedSpans`` is raised wherever the skeleton cannot tell (no root or no step number on it, a
rank without a step span, repeated span ids among the spans read, a collective or a read span
whose parent is not among the spans read), and the caller builds the step from all its spans.
One case is let through: a rank's rest that is never read is not checked for span ids used
elsewhere, so where two different spans share an id the whole build keeps the first and a
skeleton step may keep both (docs/guides/ANALYSIS.md).
"""

from __future__ import annotations

import marshal
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import is_, is_not, itemgetter, not_
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from tf_otel.analysis.model import Row, Span, add_spans
from tf_otel.analysis.steps import (
    COLLECTIVE_PARTS,
    SYNC_CATEGORIES,
    SYNC_NODES,
    TIMELINE_CATEGORIES,
    WORLD_SIZE_SPANS,
    Extent,
    RankTimeline,
    StepTrace,
    roots_and_step_spans,
    unranked_warning,
    world_ranks_of,
    world_size_of,
)
from tf_otel.record import (
    ATTR_STEP_WORLD_SIZE,
    COLLECTIVE,
    JOB,
    STALL,
    STEP,
    STEP_ROOT,
    TRANSFER,
)

SKELETON_CATEGORIES = frozenset((STEP, STEP_ROOT, JOB, STALL, COLLECTIVE, TRANSFER))
_NOT_TIMELINE = frozenset((STEP_ROOT, JOB, STALL))  # spans no rank's timeline begins with
_CATEGORY, _RANK, _GPU = itemgetter(8), itemgetter(9), itemgetter(12)
_ROW_ID, _PARENT, _EXTENT = itemgetter(1), itemgetter(2), itemgetter(4, 5, 8)
# what ``split_rows`` chooses by, for the native decoder that does the same (``load.spill``)
SKELETON_SETS = (SKELETON_CATEGORIES, _NOT_TIMELINE, SYNC_CATEGORIES)

# a piece's skeleton as marshalled: (its rows, where each is among the piece's rows, None: it is
# all of them; the ranks and the categories of the piece's rows)
Head = Tuple[List[Row], Optional[List[int]], Tuple[int, ...], Tuple[str, ...]]
Read = Callable[[int, int, int], bytes]  # (spill file number, offset, length) -> bytes


class NeedSpans(Exception):
    """The skeleton cannot decide the step exactly: build it from all its spans."""


def split_rows(rows: List[Row]) -> Head:
    """The skeleton of one trace's rows of a block, column by column (a Python step per row
    cost what reading skeletons saves)."""
    count = len(rows)
    categories = list(map(_CATEGORY, rows))
    ranks = list(map(_RANK, rows))
    keep = list(map(SKELETON_CATEGORIES.__contains__, categories))
    if None in ranks:
        for at in compress(range(count), map(is_, ranks, repeat(None))):
            keep[at] = True
    gpus = list(map(_GPU, rows))
    if gpus.count(None) != count:
        for at in compress(range(count), map(is_not, gpus, repeat(None))):
            keep[at] = True
    rank_set = set(ranks)
    rank_set.discard(None)
    for rank in rank_set:  # each rank's first span: where its timeline stands among the ranks
        at = ranks.index(rank)
        while categories[at] in _NOT_TIMELINE:
            try:
                at = ranks.index(rank, at + 1)
            except ValueError:
                break
        keep[at] = True
    first_sync = next(compress(range(count), map(SYNC_CATEGORIES.__contains__, categories)), None)
    if first_sync is not None:  # ``StepTrace.slim`` keeps the step's first sync span
        keep[first_sync] = True
    if all(keep):
        return rows, None, (), ()
    positions = list(compress(range(count), keep))
    # the ranks and categories of every row: a superset of the rest's serves the same
    return (
        list(map(rows.__getitem__, positions)),
        positions,
        tuple(sorted(rank_set)),
        tuple(sorted(set(categories))),
    )


@dataclass
class _Piece:
    spans: List[Span]  # its skeleton
    positions: Optional[List[int]]  # where they are among its rows (None: all its rows)
    ranks: Tuple[int, ...]  # of its rows
    rows: Tuple[int, int, int]  # where all its rows are: (spill file number, offset, length)
    # several ranks: the rest not read yet, by rank (rows without a rank are in the skeleton)
    by_rank: Optional[Dict[Optional[int], List[Row]]] = None


class Skeleton:
    """One trace's skeleton spans (input order), and its rest read per rank on demand."""

    def __init__(self, read: Read) -> None:
        self.spans: List[Span] = []
        self.other_categories: FrozenSet[str] = frozenset()
        self._read = read
        self._pieces: List[_Piece] = []
        self.read_ids: Set[str] = set()  # the span ids of the rests read so far

    def add(self, head: Head, rows: Tuple[int, int, int]) -> None:
        """One piece: its skeleton as marshalled, and where all its rows are."""
        skeleton, positions, ranks, categories = head
        spans: List[Span] = []
        add_spans(spans, skeleton)
        self.spans.extend(spans)
        self._pieces.append(_Piece(spans, positions, ranks, rows))
        if categories:
            self.other_categories = self.other_categories.union(categories)

    def _rows(self, piece: _Piece) -> List[Row]:
        """All the piece's rows, in input order."""
        rows: List[Row] = marshal.loads(self._read(*piece.rows))
        return rows

    def rest(self, rank: int) -> List[Span]:
        """The rank's spans not in the skeleton, in input order (``rest_rows``)."""
        spans: List[Span] = []
        add_spans(spans, self.rest_rows(rank))
        return spans

    def rest_rows(self, rank: int) -> List[Row]:
        """The rows of the rank's spans not in the skeleton, in input order; a piece of
        several ranks is decoded once and its rest kept by rank until the step is done."""
        rows: List[Row] = []
        for piece in self._pieces:
            if rank not in piece.ranks or piece.positions is None:
                continue
            if len(piece.ranks) == 1:
                rows.extend(self._rest_of(piece))
                continue
            if piece.by_rank is None:
                piece.by_rank = {}
                for row in self._rest_of(piece):
                    piece.by_rank.setdefault(row[9], []).append(row)
            rows.extend(piece.by_rank.pop(rank, ()))
        return rows

    def _rest_of(self, piece: _Piece) -> Iterable[Row]:
        rows = self._rows(piece)
        rest = [True] * len(rows)
        for at in piece.positions or ():
            rest[at] = False
        return compress(rows, rest)

    def first_spans(self, count: int) -> List[Span]:
        """The trace's first ``count`` spans with distinct ids, as ``steps.build_step`` sees
        them (the first of repeated ids)."""
        seen: Dict[str, Span] = {}
        for piece in self._pieces:
            spans = piece.spans
            if piece.positions is not None:
                # spans made of the rows it reads only (a piece holds hundreds)
                rows: Dict[str, Row] = {}
                for row in self._rows(piece):
                    if len(seen) + len(rows) >= count:
                        break
                    if row[1] not in seen:
                        rows.setdefault(row[1], row)
                spans = []
                add_spans(spans, rows.values())
            for span in spans:
                if len(seen) >= count:
                    break
                seen.setdefault(span.span_id, span)
            if len(seen) >= count:
                break
        return list(seen.values())


def _world_size(root: Span, skeleton: Skeleton) -> Optional[int]:
    """``steps.world_size_of(root, spans)``: from the root alone where it says the ranks that
    run steps (the product's roots do), else with the trace's first spans read."""
    size = world_size_of(root, [], (ATTR_STEP_WORLD_SIZE,))
    if size is not None:
        return size
    return world_size_of(root, skeleton.first_spans(WORLD_SIZE_SPANS))


def skeleton_step(trace_id: str, skeleton: Skeleton, warnings: List[str]) -> Optional[StepTrace]:
    """The trace's step as ``steps.build_step`` makes it (None: not a step), built from its
    skeleton, each rank's rest read when first asked for; ``NeedSpans`` where it cannot be."""
    spans = skeleton.spans
    by_id = dict(zip((s.span_id for s in spans), spans))
    if len(by_id) != len(spans):
        raise NeedSpans("repeated span ids")
    roots, step_spans = roots_and_step_spans(spans)
    if not roots:
        raise NeedSpans("no root")
    root = min(roots, key=lambda s: (s.start_ns, s.span_id))
    if root.step is None:
        raise NeedSpans("no step number on the root")
    ranks: Dict[int, RankTimeline] = {}
    extras: Dict[int, List[Span]] = {}  # the rest's kind of span found in the skeleton
    unranked = 0
    for span in spans:
        category = span.category
        if category in _NOT_TIMELINE:
            continue
        rank = span.rank
        if rank is None:
            unranked += 1
            continue
        timeline = ranks.get(rank)
        if timeline is None:
            own = step_spans.get(rank)
            if not own:
                raise NeedSpans(f"rank {rank} has no step span")
            step_span = min(own, key=lambda s: s.start_ns)
            start, end = min(s.start_ns for s in own), max(s.end_ns for s in own)
            timeline = ranks[rank] = RankTimeline(rank, start, end, step_span)
            timeline.more = _RestRead(skeleton, by_id, extras.setdefault(rank, []))
        if category == STEP:
            continue
        if category in SYNC_NODES:
            if span.parent_id:
                parent = by_id.get(span.parent_id)
                if parent is None:
                    raise NeedSpans("a collective's parent is not in the skeleton")
                if parent.category in TIMELINE_CATEGORIES:
                    continue  # nested: not on the rank's timeline
            timeline.syncs.append(span)
        else:
            extras[rank].append(span)
    if unranked:
        warnings.append(unranked_warning(root.step, unranked))
    if not ranks:
        return None
    world = _world_size(root, skeleton)
    start = min([root.start_ns] + [t.start_ns for t in ranks.values()])
    end = max([root.end_ns] + [t.end_ns for t in ranks.values()])
    step = StepTrace(trace_id, root.step, root.job_id, root, start, end, ranks, world, spans)
    step.other_categories = skeleton.other_categories
    step.world_ranks = world_ranks_of(root)
    return step


class _RestRead:
    """Reads a rank's rest into its timeline (``RankTimeline.more``) as ``steps.build_step``
    sorts spans: its rows are checked and sorted first, where ``extents`` reads them, and made
    spans only when the spans are asked for."""

    __slots__ = ("skeleton", "by_id", "extras", "_sorted")

    def __init__(self, skeleton: Skeleton, by_id: Dict[str, Span], extras: List[Span]) -> None:
        self.skeleton = skeleton
        self.by_id = by_id
        self.extras = extras  # the rank's skeleton spans of the rest's kind
        self._sorted: Optional[_Sorted] = None

    def extents(self, timeline: RankTimeline) -> List[Extent]:
        rows = self._sort(timeline)
        return [(s.start_ns, s.end_ns, s.category) for s in timeline.syncs + rows.extra_nodes] + [
            *map(_EXTENT, rows.nodes)
        ]

    def __call__(self, timeline: RankTimeline) -> None:
        rows = self._sort(timeline)
        self._sorted = None  # read once: the spans hold it now
        spans: List[Span] = []
        add_spans(spans, rows.nodes)
        nodes = timeline.syncs + rows.extra_nodes + spans
        fillers: List[Span] = []
        parts: Dict[str, List[Span]] = {}
        others = list(rows.extra_others)
        add_spans(others, rows.others)
        for span in others:
            if span.category in COLLECTIVE_PARTS and span.parent_id:
                parts.setdefault(span.parent_id, []).append(span)
            else:
                fillers.append(span)
        timeline.fill(nodes, fillers, parts)

    def _sort(self, timeline: RankTimeline) -> _Sorted:
        """The rank's rest read and checked: ``NeedSpans`` where it cannot be placed exactly."""
        if self._sorted is not None:
            return self._sorted
        skeleton, by_id = self.skeleton, self.by_id
        rest = skeleton.rest_rows(timeline.rank)
        own = dict(zip(map(_ROW_ID, rest), rest))  # at C speed: most rests repeat no id
        if len(own) != len(rest):
            own = {}
            for row in rest:
                own.setdefault(row[1], row)  # the first of repeated ids, as build_step keeps
            rest = list(own.values())
        if not by_id.keys().isdisjoint(own):
            raise NeedSpans("a span id in both the skeleton and the rest")
        if not skeleton.read_ids.isdisjoint(own):
            raise NeedSpans("a span id in two ranks' rests")

        def nested(parent_id: str) -> bool:
            """Whether a timeline span under ``parent_id`` is off the timeline."""
            parent = by_id.get(parent_id)
            if parent is not None:
                return parent.category in TIMELINE_CATEGORIES
            row = own.get(parent_id)
            if row is None:
                raise NeedSpans("a span's parent is not on its rank")
            return row[8] in TIMELINE_CATEGORIES

        rows = _Sorted()
        for span in self.extras:
            if span.category not in TIMELINE_CATEGORIES:
                rows.extra_others.append(span)
            elif not span.parent_id or not nested(span.parent_id):
                rows.extra_nodes.append(span)
        # the rows column by column at C speed (a Python step per row cost what decoding it did)
        on_timeline = list(map(TIMELINE_CATEGORIES.__contains__, map(_CATEGORY, rest)))
        if all(on_timeline):
            rows.nodes = rest
        else:
            rows.nodes = list(compress(rest, on_timeline))
            rows.others = list(compress(rest, map(not_, on_timeline)))
        parent_ids = set(map(_PARENT, rows.nodes))
        parent_ids.discard(None)
        parent_ids.discard("")
        off = {parent_id for parent_id in parent_ids if nested(parent_id)}
        if off:
            rows.nodes = [row for row in rows.nodes if row[2] not in off]
        skeleton.read_ids.update(own)
        self._sorted = rows
        return rows


@dataclass
class _Sorted:
    """A rank's rest, checked: its skeleton spans of the rest's kind and its rows, each split
    into timeline nodes and the others (sorted into fillers and parts when made spans)."""

    extra_nodes: List[Span] = field(default_factory=list)
    extra_others: List[Span] = field(default_factory=list)  # fillers and collective parts
    nodes: List[Row] = field(default_factory=list)  # on the timeline, in input order
    others: List[Row] = field(default_factory=list)  # fillers and collective parts
