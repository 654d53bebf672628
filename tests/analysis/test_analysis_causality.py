"""Causality repair at analysis time: a collective that ends on rank 0 before rank 1 began it
(residual clock error) is moved forward on rank 0, with its children, before the analysis."""

from __future__ import annotations

from tf_otel.analysis.analyze import analyze_spans
from tf_otel.analysis.model import Span
from tf_otel.analysis.path.causality import repair_causality

T = 1_700_000_000_000_000_000
MS = 1_000_000


def _span(span_id, parent, category, rank, start_ms, end_ms, **attributes):
    attrs = {"tf_otel.category": category, "tf_otel.step": 0, **attributes}
    if rank is not None:
        attrs["tf_otel.rank"] = rank
    return Span(
        "a" * 32,
        span_id,
        parent,
        span_id,
        T + int(start_ms * MS),
        T + int(end_ms * MS),
        attrs,
        {"tf_otel.job.id": "job"},
    )


def _trace(rank0_collective_end_ms):
    key = {"tf_otel.collective.key": "k/0/grad"}
    return [
        _span("root", None, "step.root", None, 0, 20, **{"tf_otel.world_size": 2}),
        _span("s0", "root", "step", 0, 0, 12),
        _span("c0", "s0", "collective", 0, 5, rank0_collective_end_ms, **key),
        _span("t0", "c0", "collective.transfer", 0, 6, rank0_collective_end_ms),
        _span("s1", "root", "step", 1, 0, 13),
        _span("c1", "s1", "collective", 1, 9, 12, **key),
    ]


def test_a_violation_is_shifted_forward_with_the_ranks_later_spans():
    spans = _trace(rank0_collective_end_ms=8)  # ends at 8 ms, rank 1 began at 9 ms
    by_id = {s.span_id: s for s in spans}
    repair = repair_causality(spans)
    assert repair.violations == 1 and repair.traces == 1
    assert repair.max_shift_ns == 1 * MS
    assert by_id["c0"].end_ns == by_id["c1"].start_ns  # no longer ends before rank 1 began
    assert by_id["t0"].end_ns == by_id["c0"].end_ns  # the child moved with its parent
    assert by_id["s0"].end_ns >= by_id["c0"].end_ns
    assert by_id["c0"].start_ns == T + 5 * MS  # times before the violation stay
    assert by_id["c1"].start_ns == T + 9 * MS  # the other rank is untouched


def test_consistent_traces_are_left_alone():
    spans = _trace(rank0_collective_end_ms=12)
    before = [(s.start_ns, s.end_ns) for s in spans]
    assert repair_causality(spans).violations == 0
    assert [(s.start_ns, s.end_ns) for s in spans] == before


def test_the_analysis_reports_the_repair():
    result = analyze_spans(_trace(rank0_collective_end_ms=8), source="hand-built")
    assert any("clock: 1 collective(s)" in w for w in result.warnings)
