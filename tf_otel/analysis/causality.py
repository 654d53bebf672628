"""Causality repair before analysis: no collective may end on one rank before the last rank
began it. Residual clock error that breaks this is removed with the controlled-logical-clock
forward shifts of ``tf_otel.clock.causality`` (Scalasca's idea), applied to every span of the
shifted rank in that step trace, so parents still contain their children.

Usage::

    repaired = repair_causality(spans)   # spans are changed in place
    repaired.violations, repaired.max_shift_ns
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from operator import attrgetter
from typing import Any, Dict, List, Optional, Tuple

from tf_otel.analysis.model import Span
from tf_otel.analysis.steps import spans_by_trace
from tf_otel.clock.causality import CollectiveRecord, correct
from tf_otel.pipeline.record import ATTR_COLLECTIVE_KEY, COLLECTIVE, STEP_ROOT

_CATEGORY = attrgetter("category")


@dataclass
class CausalityRepair:
    violations: int = 0
    traces: int = 0  # step traces that needed a shift
    max_shift_ns: int = 0


def repair_causality(spans: List[Span]) -> CausalityRepair:
    return repair_trace_causality(spans_by_trace(spans))


def repair_trace_causality(traces: Dict[str, List[Span]]) -> CausalityRepair:
    """``repair_causality`` on spans already split by trace (``steps.spans_by_trace``)."""
    repair = CausalityRepair()
    for trace_spans in traces.values():
        members = [
            (span, key)
            for span in compress(trace_spans, map(COLLECTIVE.__eq__, map(_CATEGORY, trace_spans)))
            if span.rank is not None
            and (key := span.attributes.get(ATTR_COLLECTIVE_KEY)) is not None
        ]
        if not members or not _may_violate(members):
            continue
        # members hold only spans with a rank (the filter above)
        fix = correct([CollectiveRecord(s.rank, key, s.start_ns, s.end_ns) for s, key in members])  # type: ignore[arg-type]
        if fix.violations:
            repair.violations += len(fix.violations)
            repair.traces += 1
            _shift(trace_spans, fix, repair)
    return repair


def _may_violate(members: List[Tuple[Span, Any]]) -> bool:
    """Whether some collective ends on one rank before another rank began it (cheap check)."""
    last_start: Dict[Any, int] = {}
    first_end: Dict[Any, int] = {}
    for span, key in members:
        if last_start.get(key, span.start_ns) <= span.start_ns:
            last_start[key] = span.start_ns
        if first_end.get(key, span.end_ns) >= span.end_ns:
            first_end[key] = span.end_ns
    return any(first_end[key] < start for key, start in last_start.items())


def _shift(trace_spans: List[Span], fix: Any, repair: CausalityRepair) -> None:
    root: Optional[Span] = None
    for span in trace_spans:
        if span.category == STEP_ROOT:
            root = span
            continue
        if span.rank is None:
            continue
        shift_start = fix.shift_ns(span.rank, span.start_ns)
        shift_end = fix.shift_ns(span.rank, span.end_ns)
        repair.max_shift_ns = max(repair.max_shift_ns, shift_start, shift_end)
        span.start_ns += shift_start
        span.end_ns += shift_end
    if root is not None:  # the root still covers every rank
        root.end_ns = max([root.end_ns] + [s.end_ns for s in trace_spans])
