"""The run's what-if: how much faster without a rank's (or a group's) excess work, every step.

Usage::

    subjects = slow_subjects(work_by_step, persistent, labels)   # ranks / groups slow throughout
    run = run_what_if(graph_of, steady_keys, subjects, step_stragglers)
    run.saving_ns[subject], run.total_saving_ns

A step straggler's saving (``stragglers``) counts a rank only in the steps where it is later
than its own usual; a rank slow in every step, or a group of ranks slow together, would save
nothing there. Here each steady step's dependency graph (``replay.step_graph``) is replayed with
the subject's excess work taken off (``StepGraph.without``: each leg cut to the other ranks'
median of the same leg, else its work scaled to theirs), and the savings summed over the run.

Slow subjects are found from the ranks' own work (time outside their syncs) in each steady step
against the median of the others' in the same step: a rank whose median ratio is at least
``1 + SLOW_MIN_EXCESS``, in at least ``SLOW_MIN_STEPS`` of the steps, is slow. Slow ranks whose
excesses are alike (the largest at most ``GROUP_SPREAD`` times the smallest) are one group,
labelled by a resource attribute they all share where there is one (``group_by``, then
``host.name``). Ranks the noise model calls persistently late are subjects too, each alone.
Ranks late by about the same amount in the same steps (``late_together``) are one subject
over those steps.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from tf_otel.analysis.compare.replay import StepGraph
from tf_otel.lateness import medians_without

SLOW_MIN_EXCESS = 0.15  # a rank's own work at least 15 % above the others' median
SLOW_MIN_STEPS = 0.6  # in at least 60 % of the steady steps
GROUP_SPREAD = 1.6  # slow ranks whose excesses differ less than this are one group
HOST_ATTRIBUTE = "host.name"
TOGETHER_SHARE = 0.6  # late together: at least this share of the step straggler's lateness
TOGETHER_MIN_STEPS = 2  # ... in at least this many steps
# a subject whose excess costs the run less than this is left out of the run's what-if
MIN_SAVING_SHARE = 0.005


@dataclass(frozen=True)
class Subject:
    """Ranks slow together throughout the run (one rank, or a group), or late together in
    some steps (``steps``)."""

    ranks: Tuple[int, ...]
    ratio: float  # their median own work / the other ranks' median, over the steady steps
    attribute: Optional[str] = None  # the resource attribute they share (a group's label)
    value: Optional[str] = None
    steps: Tuple[int, ...] = ()  # step keys where late together; () : throughout
    late_ns: int = 0  # late together: their median lateness in those steps

    @property
    def label(self) -> str:
        names = ", ".join(map(str, self.ranks))
        text = f"rank {names}" if len(self.ranks) == 1 else f"ranks {names}"
        return f"{text} ({self.attribute}={self.value})" if self.attribute else text


@dataclass
class RunWhatIf:
    subjects: List[Subject] = field(default_factory=list)
    saving_ns: Dict[Subject, int] = field(default_factory=dict)  # per subject
    # over the steady steps: every subject's excess and each step's straggler taken off at once
    total_saving_ns: int = 0
    # of which beyond the step stragglers' own savings (what the step what-ifs do not hold)
    beyond_steps_ns: int = 0
    steps: int = 0  # steady steps replayed


def work_ratios(work: Mapping[int, int]) -> Dict[int, float]:
    """Each rank's own work / the median of the other ranks' in one step."""
    if len(work) < 2:
        return {}
    median_without = medians_without(sorted(work.values()))
    ratios: Dict[int, float] = {}
    for rank, own in work.items():
        typical = median_without(own)
        if typical > 0:
            ratios[rank] = own / typical
    return ratios


def slow_subjects(
    work_by_step: Iterable[Mapping[int, int]],
    persistent: Iterable[int] = (),
    labels: Optional[Mapping[int, Mapping[str, str]]] = None,
    group_by: Optional[str] = None,
) -> List[Subject]:
    """The ranks and groups slow throughout the steady steps (``work_by_step``: each step's
    rank -> own work); ``persistent``: ranks the noise model calls persistently late;
    ``labels``: rank -> its resource attributes, for a group's label."""
    ratios: Dict[int, List[float]] = {}
    steps = 0
    for work in work_by_step:
        steps += 1
        for rank, ratio in work_ratios(work).items():
            ratios.setdefault(rank, []).append(ratio)
    if not steps:
        return []
    typical = {rank: statistics.median(values) for rank, values in ratios.items()}
    slow = {
        rank
        for rank, values in ratios.items()
        if typical[rank] >= 1 + SLOW_MIN_EXCESS
        and sum(v >= 1 + SLOW_MIN_EXCESS for v in values) >= SLOW_MIN_STEPS * steps
    }
    if len(slow) * 2 > len(typical):  # most ranks slow: the others are the odd ones, not them
        slow = set()
    subjects: List[Subject] = []
    cluster: List[int] = []
    for rank in sorted(slow, key=lambda r: (typical[r], r)):
        excess = max(typical[rank] - 1, 1e-9)
        if cluster and excess > GROUP_SPREAD * max(typical[cluster[0]] - 1, 1e-9):
            subjects.append(_subject(cluster, typical, labels, group_by))
            cluster = []
        cluster.append(rank)
    if cluster:
        subjects.append(_subject(cluster, typical, labels, group_by))
    # late by the noise model though not slower by their own work (a rank that starts its
    # steps late): each its own subject, never part of a group
    for rank in sorted(set(persistent) - slow):
        if rank in typical:
            subjects.append(Subject((rank,), typical[rank]))
    return subjects


def _subject(
    ranks: List[int],
    typical: Mapping[int, float],
    labels: Optional[Mapping[int, Mapping[str, str]]],
    group_by: Optional[str],
) -> Subject:
    ordered = tuple(sorted(ranks))
    ratio = statistics.median(typical[r] for r in ordered)
    if len(ordered) > 1 and labels:
        for attribute in (group_by, HOST_ATTRIBUTE):
            if not attribute:
                continue
            values = {labels.get(r, {}).get(attribute) for r in ordered}
            if len(values) == 1 and None not in values:
                return Subject(ordered, ratio, attribute, str(values.pop()))
    return Subject(ordered, ratio)


def late_together(
    lateness: Mapping[int, Mapping[int, int]],
    named: Mapping[int, int],
    threshold: Callable[[int], int],
    labels: Optional[Mapping[int, Mapping[str, str]]] = None,
    group_by: Optional[str] = None,
) -> List[Subject]:
    """Ranks late by about the same amount in the same steps (a host's contention, a shared
    switch): in each step with a named straggler (``named``: step key -> its rank), the ranks
    late beyond their threshold by at least ``TOGETHER_SHARE`` of its lateness; the same set
    of two or more in at least ``TOGETHER_MIN_STEPS`` steps is one subject over those steps."""
    found: Dict[Tuple[int, ...], List[int]] = {}
    for key, rank in named.items():
        late = lateness.get(key, {})
        top = late.get(rank, 0)
        if top <= 0:
            continue
        ranks = tuple(
            sorted(
                r
                for r, value in late.items()
                if value >= TOGETHER_SHARE * top and value > threshold(r)
            )
        )
        if len(ranks) > 1 and rank in ranks:
            found.setdefault(ranks, []).append(key)
    subjects = []
    for ranks, keys in sorted(found.items()):
        if len(keys) < TOGETHER_MIN_STEPS:
            continue
        values = [lateness[k][r] for k in keys for r in ranks]
        labelled = _subject(list(ranks), {r: 1.0 for r in ranks}, labels, group_by)
        subjects.append(
            Subject(
                ranks,
                1.0,
                labelled.attribute,
                labelled.value,
                tuple(keys),
                int(statistics.median(values)),
            )
        )
    return subjects


def run_what_if(
    graph_of: Callable[[int], Optional[StepGraph]],
    steady: Sequence[int],
    subjects: List[Subject],
    straggler_of: Mapping[int, Tuple[int, int]],
) -> RunWhatIf:
    """``graph_of``: step key -> its graph (the step read again: only where there are
    subjects); ``straggler_of``: step key -> (its straggler's rank, its saving) where one was
    named. Each steady step is replayed for every subject and for all of them at once; read a
    second time only where some subject's excess proves to cost the run next to nothing."""
    run = RunWhatIf(subjects=list(subjects))
    if not subjects:
        return run
    total = 0
    together: Dict[int, int] = {}  # step key -> its saving with every subject taken off
    for key in steady:
        graph = graph_of(key)
        if graph is None:
            continue
        run.steps += 1
        total += graph.duration()
        for subject in subjects:
            if subject.steps and key not in subject.steps:
                continue
            run.saving_ns[subject] = run.saving_ns.get(subject, 0) + graph.saving(subject.ranks)
        together[key] = graph.saving(_removed(subjects, key, straggler_of.get(key)))
    # the run without them all: only the subjects whose excess costs it something (a rank
    # late by the shape of its work saves nothing alone, and only noise together)
    costly = [s for s in subjects if run.saving_ns.get(s, 0) >= MIN_SAVING_SHARE * total]
    if not costly:
        return run
    for key in together:
        named = straggler_of.get(key)
        if len(costly) < len(subjects):
            graph = graph_of(key)
            if graph is None:
                continue
            together[key] = graph.saving(_removed(costly, key, named))
        own = named[1] if named else 0
        run.total_saving_ns += max(together[key], own)
        run.beyond_steps_ns += max(0, together[key] - own)
    return run


def _removed(subjects: Sequence[Subject], key: int, named: Optional[Tuple[int, int]]) -> List[int]:
    """The ranks whose excess comes off in step ``key``: the subjects' there, its straggler."""
    ranks = {r for s in subjects if not s.steps or key in s.steps for r in s.ranks}
    if named:
        ranks.add(named[0])
    return sorted(ranks)
