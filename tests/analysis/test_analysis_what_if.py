"""The answer on real-world timings: recording overlap, jitter, persistent and grouped
stragglers, and the run's what-if against a replay simulator that shares no analysis code
(job_simulator.py)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from analysis_builders import JobBuilder, decoded_spans, ms
from job_simulator import DataParallel, Pipeline

from tf_otel.analysis.analyze import analyze_spans
from tf_otel.analysis.path.critical_path import critical_path
from tf_otel.analysis.report.json_report import to_json
from tf_otel.analysis.steps import group_steps


def _minimal(overlap_us: float, steps: int = 12) -> JobBuilder:
    """Rank 1 computes 100 ms, rank 0 50 ms, one allreduce ends for both at 105 ms, then rank
    0 computes 10 ms and rank 1 5 ms; rank 0's next compute starts ``overlap_us`` early."""
    job = JobBuilder("minimal", world_size=2)
    t = 0.0
    for n in range(steps):
        step = job.step(n)
        step.rank(0, t, t + 115)
        step.rank(1, t, t + 110)
        step.span(0, "compute", "fwd", t, t + 50)
        step.span(1, "compute", "fwd", t, t + 100)
        step.collective(0, f"s{n}/g", t + 50, t + 105)
        step.collective(1, f"s{n}/g", t + 100, t + 105)
        step.span(0, "compute", "apply", t + 105 - overlap_us / 1000, t + 115)
        step.span(1, "compute", "apply", t + 105, t + 110)
        t += 120
    return job


@pytest.mark.parametrize("overlap_us", [0.0, 1.0, 15.0, 110.0])
def test_a_collective_ending_just_after_the_next_op_began_is_still_the_edge(overlap_us):
    steps, _ = group_steps(decoded_spans(_minimal(overlap_us)))
    for step in steps:
        path = critical_path(step)
        assert path.by_rank()[1] == ms(100), path.segments
        assert path.by_category()["framework"] == 0
        assert path.overlaps == (1 if overlap_us else 0)
    result = analyze_spans(decoded_spans(_minimal(overlap_us)))
    late = [f for f in result.findings if f.rule == "persistent_lateness"]
    assert [f.evidence["rank"] for f in late] == [1]
    summary = to_json(result)["summary"]
    if overlap_us:
        assert summary["path_overlaps"] == {"within_tolerance": 12, "concurrent": 0}
    else:
        assert "path_overlaps" not in summary


def test_overlap_beyond_the_tolerance_is_concurrency_and_is_said():
    # rank 0's next op begins 5 ms before its allreduce ends: the two really ran together
    steps, _ = group_steps(decoded_spans(_minimal(5000.0, steps=1)))
    path = critical_path(steps[0])
    assert path.overlaps == 0
    assert path.concurrent == 1
    assert set(path.by_rank()) == {0}  # the path stays with what ended last on rank 0


def _categories(path):
    return path.by_category()


def _random_case(rng: random.Random):
    ranks = rng.randint(2, 5)
    sim = DataParallel(
        ranks=ranks,
        steps=8,
        legs=rng.randint(2, 3),
        work_ms=rng.uniform(10, 30),
        comm_ms=rng.uniform(0.5, 3),
        slow_steps={5: (rng.randrange(ranks), rng.uniform(8, 30))},
        seed=rng.randrange(10**6),
    )
    return sim


def test_jittered_and_overlapping_timestamps_give_the_same_answer():
    """Every timestamp moved by up to +-50 us, each op starting up to 50 us before its
    collective ended: the same straggler and cause, the same path categories and ranks
    (within the jitter), over a few hundred random jobs."""
    rng = random.Random(43)
    cases = 200
    for case in range(cases):
        sim = _random_case(rng)
        exact = analyze_spans(decoded_spans(sim.job()))
        jittered = analyze_spans(decoded_spans(sim.job(jitter_us=50, overlap_us=50, seed=case)))
        context = f"case {case}: {sim.ranks} ranks, {sim.legs} legs, {sim.slow_steps}"
        bound = ms(0.05) * 4 * (sim.legs + 1)  # a few boundaries, each moved by the jitter
        named = {k: (s.rank, s.category) for k, s in exact.stragglers.step_stragglers.items()}
        again = {k: (s.rank, s.category) for k, s in jittered.stragglers.step_stragglers.items()}
        for key in named.keys() & again.keys():
            assert named[key] == again[key], context
        for key in named.keys() ^ again.keys():  # only a step at the threshold may differ
            top = max(exact.steps[key].path.excess_by_rank().values())
            threshold = exact.stragglers.noise.threshold_ns
            assert abs(top - threshold) <= bound, (context, key, top, threshold)
        assert named.get(5, (None,))[0] == sim.slow_steps[5][0], context
        assert again.get(5, (None,))[0] == sim.slow_steps[5][0], context
        for a, b in zip(exact.steps, jittered.steps):
            for category, value in a.path.by_category().items():
                assert abs(value - b.path.by_category()[category]) <= bound, (context, category)
            assert b.path.by_category()["framework"] <= bound, context
        # the slowed rank holds the path for its slow leg either way (a leg of two ranks
        # whose arrivals differ by less than the jitter may go to either of them)
        slow_rank, delay = sim.slow_steps[5]
        for result in (exact, jittered):
            assert result.steps[5].path.by_rank().get(slow_rank, 0) >= ms(delay), context


def _what_if(result):
    return result.total_ns - result.what_if_total_ns


def _above_low(result, but):
    return [(f.rule, f.summary) for f in result.findings if f.severity != "low" and f not in but]


@pytest.mark.parametrize(
    "ranks,factor", [(2, 2.0), (2, 1.5), (4, 1.5), (4, 2.0)], ids=lambda v: str(v)
)
def test_a_rank_slow_in_every_step_is_named_with_the_run_it_costs(ranks, factor):
    sim = DataParallel(ranks=ranks, steps=12, slow={1: factor})
    truth = sim.total_ms() - sim.total_ms(slow={})
    result = analyze_spans(decoded_spans(sim.job(jitter_us=50, overlap_us=20)))
    found = [f for f in result.findings if f.rule == "persistent_lateness"]
    assert [f.evidence["rank"] for f in found] == [1]
    assert found[0].evidence["what_if_saving_ms"] == pytest.approx(truth, rel=0.10)
    assert _what_if(result) / 1e6 == pytest.approx(truth, rel=0.10)
    assert not _above_low(result, found)


def test_a_slow_pair_on_one_host_is_one_group_labelled_by_the_host():
    hosts = {r: f"node{r // 2}" for r in range(8)}
    sim = DataParallel(ranks=8, steps=12, slow={2: 1.5, 3: 1.5}, hosts=hosts)
    truth = sim.total_ms() - sim.total_ms(slow={})
    result = analyze_spans(decoded_spans(sim.job(jitter_us=50, overlap_us=20)))
    groups = [f for f in result.findings if f.rule == "slow_group"]
    assert len(groups) == 1
    assert groups[0].evidence["ranks"] == [2, 3]
    assert groups[0].evidence["shared"] == {"host.name": "node1"}
    assert "host" in groups[0].suggestion
    assert groups[0].evidence["what_if_saving_ms"] == pytest.approx(truth, rel=0.10)
    assert not [f for f in result.findings if f.rule == "persistent_lateness"]
    assert not _above_low(result, groups)


def test_a_slow_pipeline_stage_is_one_group_named_by_the_users_attribute():
    pipe = Pipeline(stages=4, replicas=2, micro=4, steps=8, slow_stages={3: 1.74})
    truth = pipe.total_ms() - pipe.total_ms(slow_stages={})
    job = pipe.job(jitter_us=50)
    result = analyze_spans(decoded_spans(job), group_by="pipeline.stage")
    groups = [f for f in result.findings if f.rule == "slow_group"]
    assert [g.evidence["ranks"] for g in groups] == [[3, 7]]
    assert groups[0].evidence["shared"] == {"pipeline.stage": "3"}
    assert "Repartition" in groups[0].suggestion
    assert groups[0].evidence["what_if_saving_ms"] == pytest.approx(truth, rel=0.10)
    assert _what_if(result) / 1e6 == pytest.approx(truth, rel=0.10)
    assert not _above_low(result, groups)
    # without the setting the group is still one finding, labelled by its ranks alone
    plain = analyze_spans(decoded_spans(job))
    assert [g.evidence for g in plain.findings if g.rule == "slow_group"][0]["shared"] == {}


def test_a_one_off_straggler_what_if_is_the_sum_of_its_steps_excess():
    sim = DataParallel(ranks=4, steps=10, slow_steps={4: (2, 60.0)})
    truth = sim.total_ms() - sim.total_ms(slow_steps={})
    result = analyze_spans(decoded_spans(sim.job(jitter_us=50, overlap_us=20)))
    found = [f for f in result.findings if f.rule == "straggler"]
    assert [f.evidence["rank"] for f in found] == [2]
    assert found[0].evidence["what_if_saving_ms"] == pytest.approx(truth, rel=0.10)
    assert _what_if(result) / 1e6 == pytest.approx(truth, rel=0.10)
    assert not result.what_if.subjects


def test_ranks_late_together_in_some_steps_are_one_group_over_those_steps():
    hosts = {r: f"node{r // 2}" for r in range(8)}
    slow = {3: ((4, 5), 40.0), 7: ((4, 5), 40.0), 10: ((4, 5), 40.0)}
    sim = DataParallel(ranks=8, steps=14, slow_steps=slow, hosts=hosts)
    truth = sim.total_ms() - sim.total_ms(slow_steps={})
    result = analyze_spans(decoded_spans(sim.job(jitter_us=50, overlap_us=20)))
    groups = [f for f in result.findings if f.rule == "slow_group"]
    assert len(groups) == 1, result.findings
    evidence = groups[0].evidence
    assert (evidence["ranks"], evidence["steps"]) == ([4, 5], [3, 7, 10])
    assert evidence["shared"] == {"host.name": "node2"}
    assert evidence["median_lateness_ms"] == pytest.approx(40.0, rel=0.1)
    assert evidence["what_if_saving_ms"] == pytest.approx(truth, rel=0.10)
    assert _what_if(result) / 1e6 == pytest.approx(truth, rel=0.10)
    # named once: not also as rank 4's (or 5's) straggler steps
    assert not [f for f in result.findings if f.rule == "straggler"], result.findings


@pytest.mark.parametrize("shape", ["data_parallel", "pipeline"])
def test_controls_with_nothing_injected_find_nothing(shape):
    if shape == "pipeline":
        sim = Pipeline(stages=4, replicas=2, micro=4, steps=8)
        job = sim.job(jitter_us=50)
    else:
        sim = DataParallel(ranks=8, steps=12, hosts={r: f"node{r // 2}" for r in range(8)})
        job = sim.job(jitter_us=50, overlap_us=20)
    result = analyze_spans(decoded_spans(job), group_by="pipeline.stage")
    rules = [f.rule for f in result.findings]
    for rule in ("straggler", "persistent_lateness", "slow_group"):
        assert rule not in rules, result.findings
    assert _what_if(result) < 0.01 * result.total_ns


def test_the_cli_names_the_group_by_the_attribute_it_is_given(tmp_path):
    pipe = Pipeline(stages=4, replicas=2, micro=4, steps=8, slow_stages={3: 1.74})
    pipe.job(jitter_us=50).write_otlp(tmp_path / "spans.jsonl")
    command = [sys.executable, "-m", "tf_otel.cli", "analyze", str(tmp_path), "--format", "json"]
    done = subprocess.run(
        command + ["--group-by", "pipeline.stage"], capture_output=True, text=True, check=True
    )
    report = json.loads(done.stdout)
    groups = [f for f in report["findings"] if f["rule"] == "slow_group"]
    assert [g["evidence"]["shared"] for g in groups] == [{"pipeline.stage": "3"}]
    slow = report["summary"]["slow_throughout"]
    assert [s["ranks"] for s in slow if len(s["ranks"]) > 1] == [[3, 7]]
    assert slow[0]["label"].startswith("ranks 3, 7")
