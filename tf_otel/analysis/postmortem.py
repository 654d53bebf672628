"""What the ranks' spans say of a job that did not run whole: a rank whose spans end before the
others' (killed, stopped, its last spans never written) and a world that changed size
(Horovod Elastic), each said once rather than as a warning on every later step.

Usage::

    stopped = stopped_ranks(digests)            # (series, rank) -> (its last step, the others')
    lines = world_changes(digests, main_series)  # "world 3 -> 2 at step 13: ..."
    lines += stopped_lines(stopped, main_series)  # "rank 3's spans end at step 41 (...)"
    missing = missing_after_stop(digest, stopped)  # a step's missing ranks, less the stopped
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from tf_otel.analysis.result import StepDigest, step_label

# (series, rank) -> (the rank's last step, the last step of the others): ``stopped_ranks``
Stopped = Dict[Tuple[Optional[str], int], Tuple[int, int]]


def stopped_ranks(digests: Sequence[StepDigest]) -> Stopped:
    """The ranks whose spans end before the other ranks' (killed, stopped, or their last spans
    never written): said once each instead of a warning for every later step they miss."""
    last: Dict[Optional[str], Dict[int, int]] = {}
    for digest in digests:
        if digest.step is None:
            continue
        seen = last.setdefault(digest.series, {})
        for rank in digest.ranks:
            if seen.get(rank, -1) < digest.step:
                seen[rank] = digest.step
        for rank in digest.missing_ranks:
            seen.setdefault(rank, -1)  # a rank never seen in the series: not "stopped"
    # a rank missing from a step after its last: a stopped one; a rank no later step expects
    # left a world that changed (Horovod Elastic: the roots say the world of each step)
    expected_later: Dict[Optional[str], set] = {}
    for digest in digests:
        if digest.step is None:
            continue
        seen = last.get(digest.series, {})
        for rank in digest.missing_ranks:
            if seen.get(rank, -1) < digest.step:
                expected_later.setdefault(digest.series, set()).add(rank)
    stopped: Stopped = {}
    for series, seen in last.items():
        end = max(seen.values(), default=-1)
        for rank, step in seen.items():
            if 0 <= step < end and rank in expected_later.get(series, ()):
                stopped[(series, rank)] = (step, end)
    return stopped


def world_changes(digests: Sequence[StepDigest], main: Optional[str] = None) -> List[str]:
    """One line per change of the world between a step and the next of its series (Horovod
    Elastic), from the ranks each step expected (its root's world size); ``main``: the job's
    main series where there are several (the others' steps are labelled with theirs)."""
    lines: List[str] = []
    before: Dict[Optional[str], Tuple[int, int]] = {}  # series -> (step, world)
    for digest in sorted(
        (d for d in digests if d.step is not None), key=lambda d: (d.series or "", d.step or 0)
    ):
        world = len(digest.ranks) + len(digest.missing_ranks)
        previous = before.get(digest.series)
        if previous is not None and previous[1] != world:
            shown = digest.series if main is not None and digest.series != main else None
            label = step_label(digest.step, shown, 0)
            lines.append(
                f"world {previous[1]} -> {world} at step {label}: each step is judged by the "
                "ranks of its own world"
            )
        before[digest.series] = (digest.step or 0, world)
    return lines


def stopped_order(item: Tuple[Tuple[Optional[str], int], Tuple[int, int]]) -> Tuple[str, int]:
    (series, rank), _ = item
    return (series or "", rank)


def missing_after_stop(digest: StepDigest, stopped: Stopped) -> List[int]:
    """The step's missing ranks, less those that stopped before it (said once)."""
    if not digest.missing_ranks:
        return []
    if digest.step is None or not stopped:
        return list(digest.missing_ranks)
    series, step = digest.series, digest.step
    return [
        rank
        for rank in digest.missing_ranks
        if not ((series, rank) in stopped and stopped[(series, rank)][0] < step)
    ]


def stopped_lines(stopped: Stopped, main: Optional[str] = None) -> List[str]:
    """One line a stopped rank, by series and rank (a series other than ``main`` named)."""
    lines = []
    for (name, rank), (last, end) in sorted(stopped.items(), key=stopped_order):
        shown = name if main is not None and name != main else None
        lines.append(
            f"rank {rank}'s spans end at step {step_label(last, shown, 0)} (the others ran to "
            f"{end}): it stopped or was killed"
        )
    return lines
