"""Stragglers across steps: who is late, how often, by how much, what it costs - beyond noise.

Usage::

    warmup = warmup_keys({key: path.step.duration_ns for key, path in paths.items()})
    summary = straggler_summary(paths, warmup=warmup, min_share=0.0, min_ns=1_000_000)
    summary.step_stragglers        # {step key: StepStraggler(rank, excess_ns, saving_ns, ...)}
    summary.noise.threshold_ns     # what this run's own noise allows
    summary.ranks[1].last_arrivals

- Warm-up: the leading steps far slower than the run settles to (tracing, compiling), at most
  a quarter of the steps; reported, and kept out of everything below.
- Lateness: per step and rank, the rank's critical-path legs minus the median of the other
  ranks' same legs. The noise is learned from the steady steps' worst lateness: threshold =
  median + NOISE_SIGMAS robust sigmas. A rank late in most steps is judged against its own
  median plus the threshold.
- Step straggler: the rank whose legs exceed the others' median by the most, named only when
  that excess passes the threshold (and ``min_ns``, ``min_share``) and the step was delayed
  beyond the noise. Its excess is capped at the step's duration and its what-if saving at the
  excess, so the what-if step time stays in [0, duration]; the excess split by category names
  the cause.
- Last arrival at collectives and last to end the step: strictly last, lateness against the
  others' median.

The statistics and their reasons: docs/guides/ANALYSIS.md ("Stragglers and the what-if").
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter, sub
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from tf_otel.analysis.compare.replay import own_work
from tf_otel.analysis.path.critical_path import (
    PATH_BEFORE_STEP,
    PATH_COMMUNICATION,
    PATH_COMPUTE,
    PATH_FRAMEWORK,
    PATH_INPUT,
    CriticalPath,
)
from tf_otel.analysis.path.sync_points import Arrivals
from tf_otel.analysis.steps import RankTimeline, StepTrace
from tf_otel.lateness import MAD_TO_SIGMA, StragglerNoise, medians_without, noise_of
from tf_otel.record import ATTR_COLLECTIVE_KEY, COLLECTIVE, COMPUTE, INPUT, TRANSFER

WARMUP_Z = 3.5
WARMUP_MIN_RATIO = 1.0  # a warm-up step is at least twice the settled median
# a leading step under half the settled median is another, short Session.run (reading the
# global step, initialising) between warm-up steps, not the first settled step
WARMUP_SHORT_RATIO = 0.5
EXCESS_CATEGORIES = (PATH_BEFORE_STEP, PATH_INPUT, PATH_COMPUTE, PATH_COMMUNICATION, PATH_FRAMEWORK)
_SPAN_CATEGORY = {COLLECTIVE: PATH_COMMUNICATION, TRANSFER: PATH_COMMUNICATION, INPUT: PATH_INPUT}
# where spans overlap in a window, the first of these that is open names the time
_BY_SLOT = (PATH_COMMUNICATION, PATH_INPUT, PATH_COMPUTE)
_SLOT = {category: slot for slot, category in enumerate(_BY_SLOT)}
_START, _END, _CATEGORY = itemgetter(0), itemgetter(1), itemgetter(2)  # of an Extent
# what the noise model reads of one step: its ranks, lateness by rank and duration
Known = Tuple[Iterable[int], Dict[int, int], int]


@dataclass
class StepStraggler:
    rank: int
    excess_ns: int
    saving_ns: int
    category: str = PATH_COMPUTE
    excess_by_category_ns: Dict[str, int] = field(default_factory=dict)


@dataclass
class RankStragglerStats:
    rank: int
    steps: int = 0
    straggler_steps: List[int] = field(default_factory=list)  # step keys
    excess_ns: int = 0  # over its straggler steps
    saving_ns: int = 0  # over its straggler steps
    collectives: int = 0
    last_arrivals: int = 0
    arrival_lateness_ns: int = 0
    last_to_end: int = 0
    end_lateness_ns: int = 0


@dataclass
class StragglerSummary:
    step_stragglers: Dict[int, StepStraggler] = field(default_factory=dict)
    ranks: Dict[int, RankStragglerStats] = field(default_factory=dict)
    warmup: List[int] = field(default_factory=list)  # step keys
    noise: StragglerNoise = field(default_factory=StragglerNoise)


def _median(values: Iterable[float]) -> float:
    return statistics.median(values)


def warmup_keys(durations: Dict[int, int]) -> List[int]:
    """Leading step keys (in order) far slower than the later half of the run, up to the first
    step of ordinary length (short steps between them do not end the warm-up: tf_cnn_benchmarks
    reads its global step between its two warm-up batches, a 0.2 s run between 2.8 s ones)."""
    keys = list(durations)
    if len(keys) < 3:
        return []
    later = [durations[k] for k in keys[len(keys) // 2 :]]
    median = _median(later)
    mad = _median(abs(v - median) for v in later)
    threshold = median + max(WARMUP_Z * MAD_TO_SIGMA * mad, WARMUP_MIN_RATIO * median)
    warm = []
    for key in keys[: max(1, len(keys) // 4)]:
        if durations[key] > threshold:
            warm.append(key)
        elif durations[key] >= WARMUP_SHORT_RATIO * median:
            break
    return warm


class _RankPieces:
    """One rank's timeline nodes as ``Extent``s by start (``window_split``): every rank's are
    read where a step has a straggler, without making spans of a rest not read yet."""

    def __init__(self, timeline: RankTimeline) -> None:
        self.nodes = sorted(timeline.extents())
        self.starts = list(map(_START, self.nodes))
        self.longest = max(map(sub, map(_END, self.nodes), self.starts), default=0)
        detailed = COMPUTE in map(_CATEGORY, self.nodes)
        self.rest = PATH_FRAMEWORK if detailed else PATH_COMPUTE


def window_split(
    timeline: RankTimeline, begin: int, end: int, pieces: Optional[_RankPieces] = None
) -> Dict[str, int]:
    """How a rank spent [begin, end): before its step, input, communication, compute spans,
    and the rest (its own step work: compute without op spans, else framework). Where spans
    overlap, communication wins over input, input over compute."""
    split = dict.fromkeys(EXCESS_CATEGORIES, 0)
    if end <= begin:
        return split
    pieces = pieces or _RankPieces(timeline)
    inside = max(begin, min(end, timeline.start_ns))
    split[PATH_BEFORE_STEP] = inside - begin
    # a node starting before inside - longest ends before inside
    low = bisect_left(pieces.starts, inside - pieces.longest)
    high = bisect_left(pieces.starts, end)
    nodes = pieces.nodes[low:high]
    # where no two nodes overlap inside the window (ops one after another: the usual case)
    # each node's time is its category's and the rest is the rank's own: no sweep needed
    alone: Dict[str, int] = {}
    reached = inside
    for node_start, node_end, kind in nodes:
        start, stop = max(inside, node_start), min(end, node_end)
        if stop > start:
            if start < reached:
                break  # an overlap: the sweep below decides who names the time
            category = _SPAN_CATEGORY.get(kind, PATH_COMPUTE)
            alone[category] = alone.get(category, 0) + stop - start
            reached = stop
    else:
        for category, spent in alone.items():
            split[category] += spent
        split[pieces.rest] += end - inside - sum(alone.values())
        return split
    changes: Dict[int, List[int]] = {}  # time -> change in (communication, input, compute)
    for node_start, node_end, kind in nodes:
        start, stop = max(inside, node_start), min(end, node_end)
        if stop > start:
            slot = _SLOT[_SPAN_CATEGORY.get(kind, PATH_COMPUTE)]
            changes.setdefault(start, [0, 0, 0])[slot] += 1
            changes.setdefault(stop, [0, 0, 0])[slot] -= 1
    cuts = sorted(changes.keys() | {inside, end})
    open_now = [0, 0, 0]
    for a, b in zip(cuts, cuts[1:]):
        change = changes.get(a)
        if change is not None:
            open_now = [n + c for n, c in zip(open_now, change)]
        named = next((_BY_SLOT[i] for i, n in enumerate(open_now) if n), pieces.rest)
        split[named] += b - a
    return split


def excess_split(path: CriticalPath, rank: int) -> Dict[str, int]:
    """The rank's excess by category: its legs' split minus the others' median split."""
    step = path.step
    totals = dict.fromkeys(EXCESS_CATEGORIES, 0)
    pieces: Dict[int, _RankPieces] = {}
    for leg in path.legs:
        if leg.rank != rank or len(leg.windows) < 2:
            continue
        splits = {}
        for r, (start, end) in leg.windows.items():
            if r in step.ranks:
                if r not in pieces:
                    pieces[r] = _RankPieces(step.ranks[r])
                splits[r] = window_split(step.ranks[r], start, end, pieces[r])
        own = splits.get(rank)
        if own is None:
            continue
        for category in EXCESS_CATEGORIES:
            others = [s[category] for r, s in splits.items() if r != rank]
            totals[category] += own[category] - int(_median(others))
    return totals


def step_straggler(
    path: CriticalPath,
    noise: StragglerNoise,
    min_share: float = 0.0,
    with_spans: Optional[Callable[[], CriticalPath]] = None,
) -> Optional[StepStraggler]:
    """The step's straggler, if any; ``with_spans``: the same path on the step's spans, for a
    slimmed step whose split ``keep_for_statistics`` did not keep."""
    excess = path.excess_by_rank()
    if not excess:
        return None
    rank = _top_rank(excess)
    duration = path.step.duration_ns
    value = min(excess[rank], duration)
    if value <= 0 or value <= noise.threshold_for(rank) or value < min_share * duration:
        return None
    if rank not in noise.persistent_ns and not noise.delayed(duration - noise.typical_step_ns):
        return None  # the step is no longer than usual: nobody delayed it
    saving = min(path.saving_by_rank().get(rank, 0), value)
    if path.top_split is not None and path.top_split[0] == rank:
        split = path.top_split[1]
    elif path.step.slimmed and with_spans is not None:
        split = excess_split(with_spans(), rank)
    else:
        split = excess_split(path, rank)
    category = max(EXCESS_CATEGORIES, key=lambda c: (split[c], -EXCESS_CATEGORIES.index(c)))
    by_category = {c: v for c, v in split.items() if v > 0}
    return StepStraggler(rank, value, saving, category, by_category)


def _top_rank(excess: Dict[int, int]) -> int:
    return min(excess, key=lambda r: (-excess[r], r))


def keep_for_statistics(path: CriticalPath, min_share: float = 0.0, min_ns: int = 0) -> None:
    """Take from the step's op spans what ``straggler_summary`` reads, so the step can be
    slimmed (``StepTrace.slim``) before the statistics over all steps are made: the arrivals,
    and the split of the top rank's excess where it passes the floors every threshold holds
    (``min_ns``, ``min_share``; a rare step that passes its threshold without it is read again)."""
    path.arrival_tally = _arrival_tally(path)
    path.arrivals = None
    path.work = own_work(path.step, path.inherited)
    path.lateness_by_rank()  # cached: the noise model reads it
    excess = path.excess_by_rank()
    if excess:
        rank = _top_rank(excess)
        value = min(excess[rank], path.step.duration_ns)
        if value > min_ns and value >= min_share * path.step.duration_ns:
            path.top_split = (rank, excess_split(path, rank))
    for leg in path.legs:  # read only by the lateness and the split, both taken above
        leg.windows = {}


def _arrival_tally(path: CriticalPath) -> Tuple[Dict[int, int], List[Tuple[int, int]]]:
    arrivals = path.arrivals if path.arrivals is not None else _collective_arrivals(path.step)
    collectives: Dict[int, int] = {}
    lasts: List[Tuple[int, int]] = []
    for members in arrivals.values():
        for rank in members:
            collectives[rank] = collectives.get(rank, 0) + 1
        last = _strictly_last(members)
        if last is not None:
            lasts.append((last, members[last] - _median_others(members, last)))
    return collectives, lasts


def _strictly_last(values: Dict[int, int]) -> Optional[int]:
    if len(values) < 2:
        return None
    times = list(values.values())  # at C speed: once a collective a step
    latest = max(times)
    return list(values)[times.index(latest)] if times.count(latest) == 1 else None


def _median_others(values: Dict[int, int], rank: int) -> int:
    """The median of the others' values (``values`` holds at least two)."""
    return medians_without(sorted(values.values()))(values[rank])


def _collective_arrivals(step: StepTrace) -> Arrivals:
    arrivals: Arrivals = {}
    for rank, timeline in step.ranks.items():
        for span in timeline.syncs:
            if span.category == COLLECTIVE:
                key = span.attributes.get(ATTR_COLLECTIVE_KEY)
                if key is not None:
                    members = arrivals.setdefault(str(key), {})
                    members[rank] = min(members.get(rank, span.start_ns), span.start_ns)
    return arrivals


def straggler_summary(
    paths: Mapping[int, CriticalPath],
    min_share: float = 0.0,
    min_ns: int = 1_000_000,
    warmup: Optional[List[int]] = None,
    with_spans: Optional[Callable[[int], CriticalPath]] = None,
    known: Optional[Callable[[int], Known]] = None,
) -> StragglerSummary:
    """``paths``: step key -> critical path, in step order, read twice a step (it may read them
    from disk: ``analysis.step_store``), once where ``known`` gives the first pass's
    (a step's ranks, lateness by rank and duration, kept in memory); ``warmup``: keys kept out;
    ``with_spans``: step key -> its path on its spans (``step_straggler``)."""
    summary = StragglerSummary()
    summary.warmup = list(warmup or [])
    skipped = set(summary.warmup)
    steady = [key for key in paths if key not in skipped]
    late_by_step: List[Dict[int, int]] = []
    durations: List[int] = []
    for key in paths:
        if known is not None:
            ranks, lateness, duration = known(key)
        else:
            path = paths[key]
            ranks, duration = path.step.ranks, path.step.duration_ns
            lateness = path.lateness_by_rank() if key not in skipped else {}
        for rank in ranks:  # warm-up ranks still listed
            summary.ranks.setdefault(rank, RankStragglerStats(rank))
        if key not in skipped:
            late_by_step.append(lateness)
            durations.append(duration)
    summary.noise = noise_of(late_by_step, min_ns)
    if steady:
        summary.noise.typical_step_ns = int(_median(durations))

    def stats(rank: int) -> RankStragglerStats:
        return summary.ranks.setdefault(rank, RankStragglerStats(rank))

    for key in steady:
        path = paths[key]
        step = path.step
        for rank in step.ranks:
            stats(rank).steps += 1
        again = None if with_spans is None else partial(with_spans, key)
        found = step_straggler(path, summary.noise, min_share, again)
        if found is not None:
            summary.step_stragglers[key] = found
            rank_stats = stats(found.rank)
            rank_stats.straggler_steps.append(key)
            rank_stats.excess_ns += found.excess_ns
            rank_stats.saving_ns += found.saving_ns
        collectives, lasts = path.arrival_tally or _arrival_tally(path)
        for rank, count in collectives.items():
            stats(rank).collectives += count
        for latest, late_ns in lasts:
            stats(latest).last_arrivals += 1
            stats(latest).arrival_lateness_ns += late_ns
        ends = {rank: timeline.end_ns for rank, timeline in step.ranks.items()}
        last = _strictly_last(ends)
        if last is not None:
            stats(last).last_to_end += 1
            stats(last).end_lateness_ns += ends[last] - _median_others(ends, last)
    summary.ranks = dict(sorted(summary.ranks.items()))
    return summary
