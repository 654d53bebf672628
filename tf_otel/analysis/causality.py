"""Causality repair before analysis: no collective may end on one rank before the last rank
began it. Residual clock error that breaks this is removed with the controlled-logical-clock
forward shifts of ``tf_otel.clock.causality`` (Scalasca's idea), applied to every span of the
shifted rank in that step trace, so parents still contain their children.

Usage::

    repaired = repair_causality(spans)   # spans are changed in place
    repaired.violations, repaired.max_shift_ns
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List

from tf_otel.analysis.model import Span
from tf_otel.clock.causality import CollectiveRecord, correct
from tf_otel.record import ATTR_COLLECTIVE_KEY, COLLECTIVE, STEP_ROOT


@dataclass
class CausalityRepair:
    violations: int = 0
    traces: int = 0  # step traces that needed a shift
    max_shift_ns: int = 0


def repair_causality(spans: List[Span]) -> CausalityRepair:
    collectives: Dict[str, List[CollectiveRecord]] = defaultdict(list)
    for span in spans:
        if span.category == COLLECTIVE and span.rank is not None:
            key = span.attributes.get(ATTR_COLLECTIVE_KEY)
            if key is not None:
                collectives[span.trace_id].append(
                    CollectiveRecord(span.rank, key, span.start_ns, span.end_ns)
                )
    repair = CausalityRepair()
    fixes = {}
    for trace_id, records in collectives.items():
        fix = correct(records)
        if fix.violations:
            fixes[trace_id] = fix
            repair.violations += len(fix.violations)
            repair.traces += 1
    if not fixes:
        return repair
    roots: Dict[str, Span] = {}
    for span in spans:
        fix = fixes.get(span.trace_id)
        if fix is None:
            continue
        if span.category == STEP_ROOT:
            roots[span.trace_id] = span
            continue
        if span.rank is None:
            continue
        shift_start = fix.shift_ns(span.rank, span.start_ns)
        shift_end = fix.shift_ns(span.rank, span.end_ns)
        repair.max_shift_ns = max(repair.max_shift_ns, shift_start, shift_end)
        span.start_ns += shift_start
        span.end_ns += shift_end
    for trace_id, root in roots.items():  # the root still covers every rank
        root.end_ns = max([root.end_ns] + [s.end_ns for s in spans if s.trace_id == trace_id])
    return repair
