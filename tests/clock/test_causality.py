"""Collective causality: detection and the controlled-logical-clock forward shift."""

from __future__ import annotations

import random
from typing import List, Tuple

from tf_otel.analysis.path.causality import CollectiveRecord, correct, find_violations

R = CollectiveRecord


def test_no_violation_no_shift() -> None:
    recs = [R(0, "a", 0, 100), R(1, "a", 50, 100)]
    assert find_violations(recs) == []
    fix = correct(recs)
    assert fix.steps == {} and fix.apply(1, 10**9) == 10**9


def test_violation_found_and_repaired() -> None:
    # rank 1's clock is 30 late-to-early: its allreduce "ends" before rank 0 began it
    recs = [R(0, "a", 100, 200), R(1, "a", 40, 90)]
    [v] = find_violations(recs)
    assert (v.key, v.rank, v.by_ns) == ("a", 1, 10)
    fix = correct(recs)
    assert fix.apply(1, 90) == 100  # the end moves to the last start, no further
    assert fix.apply(1, 40) == 40  # the start (before the violation) stays
    assert fix.apply(0, 200) == 200  # rank 0 untouched


def test_children_stay_inside_parents_and_order_kept() -> None:
    recs = [R(0, "a", 100, 200), R(1, "a", 40, 90), R(0, "b", 300, 400), R(1, "b", 250, 260)]
    fix = correct(recs)
    # a parent step on rank 1 [0, 300] with children [40, 90] (collective) and [85, 95]
    parent = (0, 300)
    for child in [(40, 90), (85, 95), (90, 90)]:
        ps, pe = (fix.apply(1, t) for t in parent)
        cs, ce = (fix.apply(1, t) for t in child)
        assert ps <= cs <= ce <= pe
    assert (
        find_violations(
            [
                R(r.rank, r.key, *(fix.apply(r.rank, t) for t in (r.start_ns, r.end_ns)))
                for r in recs
            ]
        )
        == []
    )


def _random_job(seed: int, ranks: int = 4, steps: int = 40) -> List[R]:
    """Collectives with true times, then per-rank clock errors of up to +-20 units."""
    rng = random.Random(seed)
    err = [rng.uniform(-20, 20) for _ in range(ranks)]
    out = []
    t = 0.0
    for k in range(steps):
        starts = [t + rng.uniform(0, 30) for _ in range(ranks)]
        done = max(starts) + rng.uniform(1, 10)
        for r in range(ranks):
            end = done + rng.uniform(0, 3)
            out.append(R(r, f"c{k}", int(starts[r] + err[r]), int(end + err[r])))
        t = done + rng.uniform(5, 50)
    return out


def test_random_jobs_end_without_violations_and_monotone() -> None:
    found = 0
    for seed in range(20):
        recs = _random_job(seed)
        fix = correct(recs, min_latency_ns=1)
        found += len(fix.violations)
        fixed = [
            R(r.rank, r.key, fix.apply(r.rank, r.start_ns), fix.apply(r.rank, r.end_ns))
            for r in recs
        ]
        assert find_violations(fixed, min_latency_ns=1) == []
        for rank in range(4):
            times: List[Tuple[int, int]] = sorted(
                {
                    (t, fix.apply(rank, t))
                    for r in recs
                    if r.rank == rank
                    for t in (r.start_ns, r.end_ns)
                }
            )
            mapped = [m for _, m in times]
            assert mapped == sorted(mapped)  # the mapping never reorders a rank's events
        # the shift is bounded by the clock error spread (40) plus min latency per cascade
        assert fix.max_shift_ns <= 41 * 4
    assert found > 20  # the clock errors did produce violations to repair
