"""Stragglers across steps: who is late, how often, by how much, and what it costs.

Usage::

    summary = straggler_summary(paths, min_share=0.05, min_ns=1_000_000)
    summary.step_stragglers        # {step key: StepStraggler(rank, excess_ns, saving_ns)}
    summary.ranks[1].last_arrivals

Three views, per rank:
- step straggler: the rank whose legs on the critical path exceed the median rank's by the most
  in a step (``excess_ns``), counted when the excess is at least ``min_share`` of the step and
  ``min_ns``; the step's what-if saving is that rank's ``saving_ns`` (its legs cut to the next
  slowest rank's);
- last arrival at collectives: the rank that started a collective strictly last, lateness =
  its arrival - the median arrival of the others;
- last to end its step: strictly last, lateness = its end - the median end of the others.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from tf_otel.analysis.critical_path import CriticalPath
from tf_otel.analysis.steps import StepTrace
from tf_otel.record import ATTR_COLLECTIVE_KEY, COLLECTIVE


@dataclass
class StepStraggler:
    rank: int
    excess_ns: int
    saving_ns: int


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


def step_straggler(path: CriticalPath, min_share: float, min_ns: int) -> Optional[StepStraggler]:
    excess = path.excess_by_rank()
    if not excess:
        return None
    rank = min(excess, key=lambda r: (-excess[r], r))
    threshold = max(min_ns, min_share * path.step.duration_ns)
    if excess[rank] <= 0 or excess[rank] < threshold:
        return None
    return StepStraggler(rank, excess[rank], path.saving_by_rank().get(rank, 0))


def _strictly_last(values: Dict[int, int]) -> Optional[int]:
    if len(values) < 2:
        return None
    ordered = sorted(values.items(), key=lambda item: (-item[1], item[0]))
    return ordered[0][0] if ordered[0][1] > ordered[1][1] else None


def _median_others(values: Dict[int, int], rank: int) -> int:
    return int(statistics.median(v for r, v in values.items() if r != rank))


def _collective_arrivals(step: StepTrace) -> Dict[str, Dict[int, int]]:
    arrivals: Dict[str, Dict[int, int]] = {}
    for rank, timeline in step.ranks.items():
        for span in timeline.nodes:
            if span.category == COLLECTIVE:
                key = span.attributes.get(ATTR_COLLECTIVE_KEY)
                if key is not None:
                    members = arrivals.setdefault(str(key), {})
                    members[rank] = min(members.get(rank, span.start_ns), span.start_ns)
    return arrivals


def straggler_summary(
    paths: Dict[int, CriticalPath], min_share: float = 0.05, min_ns: int = 1_000_000
) -> StragglerSummary:
    """``paths``: step key -> critical path, in step order."""
    summary = StragglerSummary()

    def stats(rank: int) -> RankStragglerStats:
        return summary.ranks.setdefault(rank, RankStragglerStats(rank))

    for key, path in paths.items():
        step = path.step
        for rank in step.ranks:
            stats(rank).steps += 1
        found = step_straggler(path, min_share, min_ns)
        if found is not None:
            summary.step_stragglers[key] = found
            rank_stats = stats(found.rank)
            rank_stats.straggler_steps.append(key)
            rank_stats.excess_ns += found.excess_ns
            rank_stats.saving_ns += found.saving_ns
        arrivals = path.arrivals if path.arrivals is not None else _collective_arrivals(step)
        for members in arrivals.values():
            for rank in members:
                stats(rank).collectives += 1
            last = _strictly_last(members)
            if last is not None:
                stats(last).last_arrivals += 1
                stats(last).arrival_lateness_ns += members[last] - _median_others(members, last)
        ends = {rank: timeline.end_ns for rank, timeline in step.ranks.items()}
        last = _strictly_last(ends)
        if last is not None:
            stats(last).last_to_end += 1
            stats(last).end_lateness_ns += ends[last] - _median_others(ends, last)
    summary.ranks = dict(sorted(summary.ranks.items()))
    return summary
