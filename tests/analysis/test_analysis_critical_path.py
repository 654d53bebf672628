"""Critical paths of hand-built steps, with exact answers (times in ms, results in ns)."""

from __future__ import annotations

import random
from typing import List

from analysis_builders import EPOCH_NS, JobBuilder, decoded_spans, ms

from tf_otel.analysis.analyze import analyze_spans
from tf_otel.analysis.path.critical_path import critical_path
from tf_otel.analysis.steps import group_steps
from tf_otel.lateness import medians_without


def only_path(job: JobBuilder):
    steps, _ = group_steps(decoded_spans(job))
    assert len(steps) == 1
    return critical_path(steps[0])


def segments(path):
    return [
        (s.rank, (s.start_ns - EPOCH_NS) / 1e6, (s.end_ns - EPOCH_NS) / 1e6, s.category, s.name)
        for s in path.segments
    ]


def test_straggler_moves_the_path_to_the_last_arrival():
    job = JobBuilder("j", world_size=2)
    step = job.step(1)
    step.rank(0, 0, 100)
    step.span(0, "compute", "fwd0", 0, 30)
    step.collective(0, "g", 30, 100, wait_end=80)
    step.rank(1, 0, 100)
    step.span(1, "compute", "fwd1", 0, 80)
    step.collective(1, "g", 80, 100)
    path = only_path(job)
    assert segments(path) == [
        (1, 0.0, 80.0, "compute", "fwd1"),
        (0, 80.0, 100.0, "communication", "allreduce.g"),
    ]
    assert path.length_ns == ms(100)
    assert path.by_rank() == {0: ms(20), 1: ms(80)}
    assert path.excess_by_rank() == {1: ms(50), 0: 0}
    assert path.saving_by_rank()[1] == ms(50)


def test_ties_stay_on_the_current_rank_then_lowest_rank():
    job = JobBuilder("j", world_size=3)
    step = job.step(1)
    for rank in (2, 1, 0):  # insertion order must not matter
        step.rank(rank, 0, 50)
        step.span(rank, "compute", f"fwd{rank}", 0, 20)
        step.collective(rank, "g", 20, 40)
        step.span(rank, "compute", f"apply{rank}", 40, 50)
    path = only_path(job)
    assert [s[0] for s in segments(path)] == [0, 0, 0]
    assert segments(path)[0] == (0, 0.0, 20.0, "compute", "fwd0")
    assert path.excess_by_rank() == {0: 0}


def test_last_arrival_flag_beats_clock_order():
    # rank 0 looks later by 1 ms (clock error) but Horovod says rank 1 arrived last
    job = JobBuilder("j", world_size=2)
    step = job.step(1)
    step.rank(0, 0, 60)
    step.span(0, "compute", "fwd0", 0, 41)
    step.collective(0, "g", 41, 60, **{"horovod.last_arrival": False})
    step.rank(1, 0, 60)
    step.span(1, "compute", "fwd1", 0, 40)
    step.collective(1, "g", 40, 60, **{"horovod.last_arrival": True})
    path = only_path(job)
    assert segments(path)[0] == (1, 0.0, 40.0, "compute", "fwd1")
    assert segments(path)[1] == (0, 40.0, 60.0, "communication", "allreduce.g")


def test_missing_rank_wait_is_straggler_wait():
    job = JobBuilder("j", world_size=3)  # rank 2 reports nothing
    step = job.step(5)
    for rank, arrive in ((0, 10), (1, 12)):
        step.rank(rank, 0, 100)
        step.span(rank, "compute", f"fwd{rank}", 0, arrive)
        step.collective(rank, "g", arrive, 100, wait_end=90, **{"horovod.last_arrival": False})
    steps, _ = group_steps(decoded_spans(job))
    assert steps[0].missing_ranks == [2]
    path = critical_path(steps[0])
    assert segments(path) == [
        (1, 0.0, 12.0, "compute", "fwd1"),  # the last rank seen to arrive
        (0, 12.0, 90.0, "straggler_wait", "allreduce.g"),  # then everyone waits for rank 2
        (0, 90.0, 100.0, "communication", "allreduce.g"),
    ]
    result = analyze_spans(decoded_spans(job))
    assert any("ranks [2]" in warning for warning in result.warnings)


def test_overlapping_spans_are_not_counted_twice():
    job = JobBuilder("j", world_size=1)
    step = job.step(1)
    step.rank(0, 0, 100)
    step.span(0, "compute", "a", 0, 50)
    step.span(0, "compute", "b", 30, 80)  # overlaps a
    step.span(0, "compute", "inner", 35, 45)  # inside b, ends before b
    step.span(0, "framework", "python", 80, 100)
    path = only_path(job)
    assert segments(path) == [
        (0, 0.0, 30.0, "compute", "a"),
        (0, 30.0, 80.0, "compute", "b"),
        (0, 80.0, 100.0, "framework", "python"),
    ]
    assert path.by_category()["compute"] == ms(80)
    assert path.by_category()["framework"] == ms(20)


def test_input_bound_step_and_gaps():
    job = JobBuilder("j", world_size=2)
    step = job.step(1)
    for rank in (0, 1):
        step.rank(rank, 0, 100)
        step.span(rank, "input", "IteratorGetNext", 0, 60)
        step.span(rank, "compute", "fwd", 65, 80)  # 5 ms gap before it
        step.collective(rank, "g", 80, 100)
    result = analyze_spans(decoded_spans(job))
    split = result.steps[0].path.by_category()
    assert split == {
        "compute": ms(15),
        "input": ms(60),
        "communication": ms(20),
        "straggler_wait": 0,
        "framework": ms(5),  # ops are traced on this rank: a gap between them is framework
        "before_step": 0,
    }
    assert [f.rule for f in result.findings] == ["input_bound"]
    assert result.findings[0].evidence["share"] == 0.6


def test_ps_transfer_waits_for_the_later_peer():
    job = JobBuilder("j", world_size=2)  # rank 0 a worker, rank 1 a parameter server
    step = job.step(1)
    step.rank(0, 0, 60)
    step.span(0, "transfer", "RecvTensor w", 0, 50, **{"tensorflow.transfer.edge": "e1"})
    step.span(0, "compute", "apply", 50, 60)
    step.rank(1, 0, 50)
    step.span(1, "compute", "ps update", 0, 40)
    step.span(1, "transfer", "send w", 40, 50, **{"tensorflow.transfer.edge": "e1"})
    path = only_path(job)
    assert segments(path) == [
        (1, 0.0, 40.0, "compute", "ps update"),
        (0, 40.0, 50.0, "communication", "RecvTensor w"),
        (0, 50.0, 60.0, "compute", "apply"),
    ]


def test_late_rank_start_and_root_after_ranks():
    job = JobBuilder("j", world_size=2)
    step = job.step(1)
    step.rank(0, 0, 50)
    step.span(0, "compute", "fwd0", 0, 10)
    step.collective(0, "g", 10, 50)
    step.rank(1, 20, 50)  # starts its step 20 ms late
    step.span(1, "compute", "fwd1", 20, 30)
    step.collective(1, "g", 30, 50)
    path = only_path(job)
    assert segments(path) == [
        (1, 0.0, 20.0, "before_step", "(before rank's step)"),
        (1, 20.0, 30.0, "compute", "fwd1"),
        (0, 30.0, 50.0, "communication", "allreduce.g"),
    ]
    # the lateness counts against rank 1: 30 ms to arrive vs rank 0's 10 ms
    assert path.excess_by_rank()[1] == ms(20)


def test_straggler_steps_what_if_and_outliers_across_steps():
    job = JobBuilder("j", world_size=4)
    delayed = {3: 30.0, 7: 12.5}
    for number in range(12):
        step = job.step(number)
        base = number * 200
        delay = delayed.get(number, 0.0)
        for rank in range(4):
            late = delay if rank == 2 else 0.0
            jitter = rank * 0.5  # ranks differ a little: median of the others matters
            step.rank(rank, base, base + 100 + delay)
            step.span(rank, "compute", "fwd", base, base + 60 + jitter + late)
            step.collective(rank, f"g{number}", base + 60 + jitter + late, base + 90 + delay)
            step.span(rank, "compute", "apply", base + 90 + delay, base + 100 + delay)
    result = analyze_spans(decoded_spans(job))
    stragglers = {r.trace.step: r.straggler for r in result.steps if r.straggler}
    assert sorted(stragglers) == [3, 7]
    assert {s.rank for s in stragglers.values()} == {2}
    # rank 2's leg: 60 + 1.0 + delay; others 60, 60.5, 61.5 -> median 60.5
    assert stragglers[3].excess_ns == ms(30.0 + 1.0 - 0.5)
    assert stragglers[7].excess_ns == ms(12.5 + 1.0 - 0.5)
    # saving: cut to the slowest other rank (61.5)
    assert stragglers[3].saving_ns == ms(30.0 + 1.0 - 1.5)
    step3 = next(r for r in result.steps if r.trace.step == 3)
    assert step3.what_if_ns == ms(130) - ms(29.5)
    assert result.outliers.outliers == [3, 7]
    rank2 = result.stragglers.ranks[2]
    assert rank2.straggler_steps == [3, 7]
    assert rank2.last_arrivals == 2
    assert rank2.arrival_lateness_ns == ms(30.5) + ms(13.0)  # vs the others' median arrival
    assert result.stragglers.ranks[3].last_arrivals == 10  # the jitter makes rank 3 last
    rules = [f.rule for f in result.findings]
    assert "straggler" in rules and "step_outliers" in rules
    finding = next(f for f in result.findings if f.rule == "straggler")
    assert finding.evidence["rank"] == 2 and finding.evidence["steps"] == [3, 7]


def test_noise_below_threshold_names_no_straggler():
    job = JobBuilder("j", world_size=2)
    for number in range(5):
        step = job.step(number)
        base = number * 200
        for rank in range(2):
            step.rank(rank, base, base + 100)
            step.span(rank, "compute", "fwd", base, base + 60 + rank * 0.9)  # 0.9 ms < 1 ms
            step.collective(rank, f"g{number}", base + 60 + rank * 0.9, base + 100)
    result = analyze_spans(decoded_spans(job))
    assert all(r.straggler is None for r in result.steps)
    assert not [f for f in result.findings if f.rule == "straggler"]


def test_gpu_rule_only_with_gpu_metrics():
    job = JobBuilder("j", world_size=1)
    step = job.step(1)
    step.rank(0, 0, 10)
    step.span(0, "compute", "fwd", 0, 10)
    assert not [
        f for f in analyze_spans(decoded_spans(job)).findings if f.rule == "low_gpu_utilization"
    ]
    step.span(0, "kernel", "gemm", 1, 2, **{"gpu.utilization": 0.35})
    findings = analyze_spans(decoded_spans(job)).findings
    low = [f for f in findings if f.rule == "low_gpu_utilization"]
    assert low and low[0].evidence["p95_percent_by_rank"] == {"0": 35.0}


def _median_leaving_out(ordered: List[int], value: int) -> int:
    """The plain way: the list without the first occurrence of ``value``, its median (the
    mean of the middle two rounded toward zero, as the analysis has always taken it)."""
    rest = list(ordered)
    rest.remove(value)
    n = len(rest)
    if n % 2:
        return rest[n // 2]
    return int((rest[n // 2 - 1] + rest[n // 2]) / 2)


def test_medians_without_each_value_match_leaving_it_out():
    rng = random.Random(7)
    for _ in range(2000):
        ordered = sorted(rng.choice([0, 1, 5, 7, 7, 9, 10**9]) for _ in range(rng.randint(2, 9)))
        median_without = medians_without(ordered)
        for value in ordered:
            assert median_without(value) == _median_leaving_out(ordered, value), (ordered, value)
