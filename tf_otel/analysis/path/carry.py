"""What each rank carries into a step from its previous one: the end of its last collective, or
of its step span where the previous step has no collective spans.

Usage::

    previous = previous_steps(all_steps)             # trace id -> PreviousStep (the step numbered
    carried = carried_into(step, previous.get(step.trace_id))   # one less, its evidence step)
    found = previous_keys([step_key(s, i) for i, s in enumerate(all_steps)])  # the same, on keys
    carried[1].inherited_ns                          # not rank 1's own lateness in this step

In a ring all-reduce over a slow link, one rank gets its last chunk well after the others: it
ends the step late and begins the next one late, through no work of its own. A rank's
``inherited_ns`` is how much later than the other ranks' median its last collective of the
previous step ended, at most how much later than the others' median it began this step. The
straggler and lateness statistics take it off the rank's first leg; its own work after its last
collective is not carried: that stays its lateness.

Where the previous step has no collective spans (collective detail samples 1 step in N), the
previous step span's end stands in, bounded by how late the rank's last collective ended in the
**evidence step** (this step, else the nearest step of the same name with collective spans):
that tells a rank behind a slow link from one that works on after its last collective. In a
job with no collective spans anywhere nothing is carried. Steps are matched by number and name
(``<step key> step <n>``); an ambiguous match carries nothing. The rules and their limits:
docs/guides/ANALYSIS.md ("What a rank carries into the next step").
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

from tf_otel.analysis.model import Span
from tf_otel.analysis.steps import SYNC_CATEGORIES, StepTrace
from tf_otel.lateness import medians_without
from tf_otel.record import COLLECTIVE

CARRIED_NAME = "(previous step) "  # prefix of the path segment it books
_ROOT_NAME = re.compile(r"^(.*?)\s*step (\d+)$")


@dataclass(frozen=True)
class Carry:
    """One rank's last collective of the previous step (or, where that step has no collective
    spans, its step span), and what the rank inherited from it."""

    rank: int
    end_ns: int  # where that collective (step span) ended on this rank
    inherited_ns: int  # >= 0: how much of this step's late start is the previous step's
    name: str
    span_id: Optional[str]
    collective: bool = True  # False: carried from the previous step span's end
    evidence_step: Optional[int] = None  # step span carry: the step whose collectives bound it


@dataclass(frozen=True)
class PreviousStep:
    """A step's previous step (numbered one less, same name) and, where that one has no
    collective or transfer spans, the evidence step: the step itself if it has collective spans,
    else the nearest step with the same name that has them (None: no such step)."""

    trace: StepTrace
    evidence: Optional[StepTrace] = None


def step_name(step: StepTrace) -> Optional[str]:
    """The step's key: its root's name less `` step <n>``; without a root, a step span's name
    (TF1 ``Session.run`` signatures share that one)."""
    if step.root is not None:
        found = _ROOT_NAME.match(step.root.name)
        if found and step.step is not None and int(found.group(2)) == step.step:
            return found.group(1)
        return step.root.name
    names = {t.step_span.name for t in step.ranks.values() if t.step_span is not None}
    return names.pop() if len(names) == 1 else None


@dataclass(frozen=True)
class StepKey:
    """What the match of steps reads of one step (``step_key``), small enough to keep for every
    step of a job while the steps themselves wait on disk (``analysis.step_store``)."""

    trace_id: str
    step: Optional[int]
    start_ns: int
    name: Optional[str]  # ``step_name``
    collective: bool  # it has a collective span
    sync: bool  # ``has_sync_spans``
    index: int  # where the step is kept (a list's or a ``Paged``'s position)


def step_key(step: StepTrace, index: int) -> StepKey:
    """``step``'s ``StepKey``, the step kept at ``index``."""
    return StepKey(
        step.trace_id,
        step.step,
        step.start_ns,
        step_name(step),
        _has_collective(step),
        has_sync_spans(step),
        index,
    )


def previous_steps(steps: Sequence[StepTrace]) -> Dict[str, PreviousStep]:
    """Trace id -> the step numbered one less with the same name, where exactly one is, with its
    evidence step (``PreviousStep``); none where no step has a collective span (there is nothing to
    carry: module docstring)."""
    found = previous_keys([step_key(step, index) for index, step in enumerate(steps)])
    return {
        trace_id: PreviousStep(
            steps[before.index], steps[evidence.index] if evidence is not None else None
        )
        for trace_id, (before, evidence) in found.items()
    }


def previous_keys(keys: Sequence[StepKey]) -> Dict[str, Tuple[StepKey, Optional[StepKey]]]:
    """``previous_steps`` on the steps' keys: trace id -> (the previous step's key, the evidence
    step's key)."""
    if not any(key.collective for key in keys):
        return {}
    by_key: Dict[Tuple[Optional[str], int], List[StepKey]] = {}
    for key in keys:
        if key.step is not None:
            by_key.setdefault((key.name, key.step), []).append(key)
    # per name, the numbers of the (unambiguous) steps with collective spans, in order
    detail: Dict[Optional[str], List[int]] = {}
    for (name, number), group in sorted(by_key.items(), key=lambda item: item[0][1]):
        if len(group) == 1 and group[0].collective:
            detail.setdefault(name, []).append(number)
    found: Dict[str, Tuple[StepKey, Optional[StepKey]]] = {}
    for (name, number), group in by_key.items():
        before = by_key.get((name, number - 1), [])
        if len(before) == 1 and len(group) == 1 and name is not None:
            evidence = None
            if not before[0].sync:
                near = _nearest(detail.get(name, []), number)
                evidence = by_key[(name, near)][0] if near is not None else None
            found[group[0].trace_id] = (before[0], evidence)
    return found


def _nearest(numbers: List[int], number: int) -> Optional[int]:
    """The value in sorted ``numbers`` nearest ``number``; the later of two as near."""
    at = bisect_left(numbers, number)
    candidates = numbers[max(0, at - 1) : at + 1]
    return min(candidates, key=lambda n: (abs(n - number), -n)) if candidates else None


def _has_collective(step: StepTrace) -> bool:
    return any(s.category == COLLECTIVE for s in _syncs(step))


def _syncs(step: StepTrace) -> Iterator[Span]:
    return (span for timeline in step.ranks.values() for span in timeline.syncs)


def last_collectives(step: StepTrace) -> Dict[int, Span]:
    """Each rank's collective that ended last in the step (ranks without one left out)."""
    last: Dict[int, Span] = {}
    for rank, timeline in step.ranks.items():
        for span in timeline.syncs:
            if span.category == COLLECTIVE and (
                rank not in last or span.end_ns > last[rank].end_ns
            ):
                last[rank] = span
    return last


def _beyond_others(values: Dict[int, int]) -> Dict[int, int]:
    """How much later than the other ranks' median each rank's value is (0 if not later); one
    sort (a median of the others a rank was O(ranks^2) a step)."""
    if len(values) < 2:
        return dict.fromkeys(values, 0)
    median_without = medians_without(sorted(values.values()))
    return {rank: max(0, value - median_without(value)) for rank, value in values.items()}


def step_spans(step: StepTrace) -> Dict[int, Span]:
    """Each rank's step span (ranks without one left out)."""
    return {r: t.step_span for r, t in step.ranks.items() if t.step_span is not None}


def has_sync_spans(step: StepTrace) -> bool:
    """Whether the step has a collective (or its wait/transfer part) or a PS transfer span."""
    return any(span.category in SYNC_CATEGORIES for span in step.spans)


def carried_into(
    step: StepTrace, previous: Union[PreviousStep, StepTrace, None]
) -> Dict[int, Carry]:
    """Rank -> what it carried into ``step`` from ``previous`` (its step numbered one less, from
    ``previous_steps``): from its last collective there, or from its step span's end where
    ``previous`` has no collective or transfer spans, then at most how late its last collective
    ended in the evidence step (``PreviousStep.evidence``; given a bare step N - 1, ``step`` itself
    where it has collective spans); only ranks with one, in this step too, and at least two."""
    if previous is None:
        return {}
    if isinstance(previous, PreviousStep):
        before, evidence = previous.trace, previous.evidence
    else:
        before, evidence = previous, step if _has_collective(step) else None
    collective = has_sync_spans(before)
    found = last_collectives(before) if collective else step_spans(before)
    last = {r: s for r, s in found.items() if r in step.ranks}
    if len(last) < 2:
        return {}
    ends = {rank: span.end_ns for rank, span in last.items()}
    starts = {rank: step.ranks[rank].start_ns for rank in last}
    late_end, late_start = _beyond_others(ends), _beyond_others(starts)
    inherited = {rank: min(late_end[rank], late_start[rank]) for rank in last}
    evidence_step = None
    if not collective:  # a step span end: only what the evidence step shows as inherited
        bounds = _evidence_bounds(evidence, last)
        inherited = {rank: min(value, bounds.get(rank, 0)) for rank, value in inherited.items()}
        evidence_step = evidence.step if evidence is not None else None
    return {
        rank: Carry(
            rank,
            span.end_ns,
            inherited[rank],
            span.name,
            span.span_id,
            collective,
            evidence_step,
        )
        for rank, span in last.items()
    }


def _evidence_bounds(evidence: Optional[StepTrace], ranks: Dict[int, Span]) -> Dict[int, int]:
    """Rank -> how much later than the other ranks' median its last collective ended in the
    evidence step (0, or left out: on time, or no collective there; nothing without one)."""
    if evidence is None:
        return {}
    ends = {rank: span.end_ns for rank, span in last_collectives(evidence).items()}
    late = _beyond_others(ends)
    return {rank: late[rank] for rank in ranks if rank in ends}
