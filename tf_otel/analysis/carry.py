"""What each rank carries into a step from its previous one: the end of its last collective, or
of its step span where the previous step has no collective spans.

Usage::

    previous = previous_steps(all_steps)             # trace id -> the step numbered one less
    carried = carried_into(step, previous.get(step.trace_id))
    carried[1].inherited_ns                          # not rank 1's own lateness in this step

In a ring all-reduce over a slow link, one rank gets its last chunk well after the others: it
ends the step late and begins the next one late, through no work of its own. A rank's
``inherited_ns`` is how much later than the other ranks' median its last collective of the
previous step ended, at most how much later than the others' median it began this step (what
it inherited can only explain a late start it really shows). The straggler and lateness
statistics take it off the rank's first leg (step start -> first sync); the critical path
books the time the rank was still in that collective after the step began as communication.
Its own work after its last collective is not carried: that stays its lateness.

A previous step with no collective or transfer spans (collective detail samples 1 step in
``TF_OTEL_HOROVOD_EVERY``: the step before a detail step almost never has them) carries from
each rank's previous **step span** end instead, the same way: how much later than the others'
median it ended, at most how much later it began this step (``Carry.collective`` False). Its
own work after its last collective then made its previous span end late, and that time lies in
the previous step, where its extent ends last; where the previous step has collective spans,
their end is the better reference and the rule above holds (docs/ANALYSIS.md, version 1). Only
in a job with collective spans on some step: with none anywhere (collective detail off, a
parameter-server job) nothing is carried, as before, since there no step would measure a
rank's own work after its last collective against the collective's end.

Steps are matched by number and name: the previous step of ``K step N`` is ``K step N-1`` (the
root span's name, ``<step key> step <n>``: the step function, for TF1 the fetch signature).
Without a root the ranks' step span name stands in, and TF1's ``Session.run`` signatures share
it: two such steps with the same number make the match ambiguous, and nothing is carried.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from tf_otel.analysis.model import Span
from tf_otel.analysis.steps import StepTrace
from tf_otel.record import COLLECTIVE, COLLECTIVE_TRANSFER, COLLECTIVE_WAIT, TRANSFER

CARRIED_NAME = "(previous step) "  # prefix of the path segment it books
_ROOT_NAME = re.compile(r"^(.*?)\s*step (\d+)$")
# a previous step with any of these carries from its last collectives (or, transfers only, not)
_SYNC_SPANS = frozenset((COLLECTIVE, COLLECTIVE_WAIT, COLLECTIVE_TRANSFER, TRANSFER))


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


def previous_steps(steps: Sequence[StepTrace]) -> Dict[str, StepTrace]:
    """Trace id -> the step numbered one less with the same name, where exactly one is; none
    where no step has a collective span (there is nothing to carry: module docstring)."""
    if not any(s.category == COLLECTIVE for step in steps for s in _nodes(step)):
        return {}
    by_key: Dict[Tuple[Optional[str], int], List[StepTrace]] = {}
    for step in steps:
        if step.step is not None:
            by_key.setdefault((step_name(step), step.step), []).append(step)
    found: Dict[str, StepTrace] = {}
    for (name, number), group in by_key.items():
        before = by_key.get((name, number - 1), [])
        if len(before) == 1 and len(group) == 1 and name is not None:
            found[group[0].trace_id] = before[0]
    return found


def _nodes(step: StepTrace) -> Iterator[Span]:
    return (span for timeline in step.ranks.values() for span in timeline.nodes)


def last_collectives(step: StepTrace) -> Dict[int, Span]:
    """Each rank's collective that ended last in the step (ranks without one left out)."""
    last: Dict[int, Span] = {}
    for rank, timeline in step.ranks.items():
        for span in timeline.nodes:
            if span.category == COLLECTIVE and (
                rank not in last or span.end_ns > last[rank].end_ns
            ):
                last[rank] = span
    return last


def _beyond_others(values: Dict[int, int], rank: int) -> int:
    """How much later than the other ranks' median this rank's value is (0 if not later)."""
    others = [v for r, v in values.items() if r != rank]
    return max(0, values[rank] - int(statistics.median(others))) if others else 0


def step_spans(step: StepTrace) -> Dict[int, Span]:
    """Each rank's step span (ranks without one left out)."""
    return {r: t.step_span for r, t in step.ranks.items() if t.step_span is not None}


def has_sync_spans(step: StepTrace) -> bool:
    """Whether the step has a collective (or its wait/transfer part) or a PS transfer span."""
    return any(span.category in _SYNC_SPANS for span in step.spans)


def carried_into(step: StepTrace, previous: Optional[StepTrace]) -> Dict[int, Carry]:
    """Rank -> what it carried into ``step`` from ``previous`` (its step numbered one less, from
    ``previous_steps``): from its last collective there, or from its step span's end where
    ``previous`` has no collective or transfer spans; only ranks with one, in this step too,
    and at least two."""
    if previous is None:
        return {}
    collective = has_sync_spans(previous)
    found = last_collectives(previous) if collective else step_spans(previous)
    last = {r: s for r, s in found.items() if r in step.ranks}
    if len(last) < 2:
        return {}
    ends = {rank: span.end_ns for rank, span in last.items()}
    starts = {rank: step.ranks[rank].start_ns for rank in last}
    return {
        rank: Carry(
            rank,
            span.end_ns,
            min(_beyond_others(ends, rank), _beyond_others(starts, rank)),
            span.name,
            span.span_id,
            collective,
        )
        for rank, span in last.items()
    }
