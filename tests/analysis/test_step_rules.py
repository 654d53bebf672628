"""The whole-step findings (issue 15 point 6) on hand-built step spans: each rule at its
threshold, just under it, and a control that must find nothing; the attributes travel through
the real OTLP-JSON decoders (generic and msgspec) and the reports."""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List

import pytest
from analysis_builders import JobBuilder, decoded_spans

from tf_otel.analysis.analyze import analyze_spans
from tf_otel.analysis.load.files import load_paths
from tf_otel.analysis.outliers import OutlierStats
from tf_otel.analysis.report.json_report import to_json
from tf_otel.analysis.result import AnalysisResult
from tf_otel.analysis.rules import step_rules
from tf_otel.analysis.rules.gpu_rule import low_gpu_findings
from tf_otel.analysis.rules.input_rule import input_bound_findings
from tf_otel.analysis.rules.step_rules import (
    between_steps_findings,
    cpu_bound_findings,
    input_source_findings,
    memory_growth_findings,
    small_batch_findings,
    theil_sen_slope,
)
from tf_otel.analysis.rules.whole_step import StepSample
from tf_otel.analysis.stragglers import StragglerSummary

MS = 1_000_000
MIB = 2**20
# the samples alone: a result with no steps, so a rule's critical-path / span source has nothing
NO_PATH = AnalysisResult("samples", None, [], StragglerSummary(), OutlierStats())


def samples(count: int = 20, rank: int = 0, **fields: Any) -> List[StepSample]:
    """``count`` equal steps; a field given as a callable is called with the step number."""
    built = []
    for step in range(count):
        values = {k: (v(step) if callable(v) else v) for k, v in fields.items()}
        values.setdefault("duration_ns", 10 * MS)
        built.append(StepSample(rank=rank, step=step, **values))
    return built


def rules(findings) -> List[str]:
    return [f.rule for f in findings]


# -- input-bound: the TF profiler's grades and the timing tail's floor ------------------------


@pytest.mark.parametrize(
    "wait_ms, expected",
    [(0.49, None), (0.5, "moderately"), (1.99, "moderately"), (2.0, "highly"), (8.0, "highly")],
)
def test_input_bound_grades_at_5_and_20_percent(wait_ms, expected):
    found = input_bound_findings(
        NO_PATH, samples(input_wait_ns=round(wait_ms * MS), input_elements=1)
    )
    if expected is None:
        assert found == []
        return
    (finding,) = found
    assert finding.evidence["grade"] == expected
    assert finding.severity == ("high" if expected == "highly" else "medium")
    assert finding.evidence["share"] == pytest.approx(wait_ms / 10, abs=1e-4)
    assert finding.evidence["by_rank"]["0"]["wait_per_step_ms"] == pytest.approx(wait_ms)


def test_input_wait_below_the_floor_per_batch_is_noise():
    # 0.15 ms a batch on 1 ms steps is 15 %: the timing tail's own cost, not the pipeline's
    tiny = samples(duration_ns=MS, input_wait_ns=150_000, input_elements=1)
    assert input_bound_findings(NO_PATH, tiny) == []
    # the same wait spread over 4 batches a call (steps_per_execution) is even more so
    assert input_bound_findings(NO_PATH, samples(input_wait_ns=760_000, input_elements=4)) == []
    assert input_bound_findings(NO_PATH, samples(input_wait_ns=800_000, input_elements=1)) != []


def test_input_bound_names_only_the_waiting_rank():
    run = samples(rank=0, input_wait_ns=0, input_elements=1)
    run += samples(rank=1, input_wait_ns=5 * MS, input_elements=1)
    (finding,) = input_bound_findings(NO_PATH, run)
    assert list(finding.evidence["by_rank"]) == ["1"]
    assert "rank 1" in finding.summary


def test_no_input_attributes_no_finding():
    assert input_bound_findings(NO_PATH, samples()) == []


# -- I/O-bound vs decode-bound -----------------------------------------------------------------


def _input_bound(**fields: Any) -> List[StepSample]:
    return samples(input_wait_ns=6 * MS, input_elements=1, between_ns=MS, cpus=2, **fields)


def test_large_reads_for_the_wait_with_idle_cpu_are_io_bound():
    # 1 MiB read per 6 ms of wait: 167 MiB/s; CPU 20 % of 2 cores
    run = _input_bound(read_bytes=MIB, read_ops=16, cpu_time_ns=round(0.2 * 2 * 11 * MS))
    (finding,) = input_source_findings(run)
    assert finding.rule == "io_bound_input"
    stats = finding.evidence["by_rank"]["0"]
    assert stats["read_rate_during_wait_mib_s"] == pytest.approx(1 / 0.006, rel=1e-3)
    assert stats["cpu_share"] == pytest.approx(0.2)


def test_little_read_for_the_wait_is_decode_bound():
    # 16 KiB a step for 6 ms of wait: 2.6 MiB/s, far below what any storage delivers
    (finding,) = input_source_findings(_input_bound(read_bytes=16 * 1024, read_ops=2))
    assert finding.rule == "decode_bound_input"


def test_busy_cpu_makes_even_large_reads_decode_bound():
    run = _input_bound(read_bytes=MIB, cpu_time_ns=round(0.6 * 2 * 11 * MS))
    assert rules(input_source_findings(run)) == ["decode_bound_input"]


def test_read_rate_threshold():
    wait_s = 0.006
    at = round(step_rules.IO_MIN_READ_RATE * wait_s)
    assert rules(input_source_findings(_input_bound(read_bytes=at))) == ["io_bound_input"]
    assert rules(input_source_findings(_input_bound(read_bytes=at - 64))) == ["decode_bound_input"]


def test_one_large_read_does_not_make_every_wait_a_read():
    # a real GPU job read 6.4 MiB in one step (libraries, a cache) and ~160 B in the others: the
    # mean rate over the wait passed 10 MiB/s; a typical step's reads over its wait do not
    run = _input_bound(read_bytes=lambda step: 6 * MIB if step == 1 else 160, read_ops=2)
    (finding,) = input_source_findings(run)
    assert finding.rule == "decode_bound_input"
    assert finding.evidence["by_rank"]["0"]["median_read_per_step_mib"] == 0.0
    # control: the same large read in every step is a read for every wait
    assert rules(input_source_findings(_input_bound(read_bytes=6 * MIB))) == ["io_bound_input"]


def test_tf_otels_own_detail_steps_are_left_out_of_the_reads_and_cpu():
    # every other step traced ops (tf_otel.detail): its profiler and /proc reads are tf_otel's
    run = _input_bound(
        read_bytes=lambda step: 8 * MIB if step % 2 == 0 else 160,
        detail=lambda step: step % 2 == 0,
    )
    (finding,) = input_source_findings(run)
    assert finding.rule == "decode_bound_input"
    assert finding.evidence["by_rank"]["0"]["detail_steps_left_out"] == 10
    # control: the same reads on steps nobody marked are the program's
    run = _input_bound(read_bytes=lambda step: 8 * MIB if step % 2 == 0 else 160)
    assert rules(input_source_findings(run)) == ["io_bound_input"]
    # and the CPU tf_otel spent on its detail steps does not make the rank CPU-bound
    busy = samples(
        between_ns=2 * MS,
        cpus=4,
        cpu_time_ns=lambda step: 4 * 12 * MS if step % 2 == 0 else 12 * MS,
        detail=lambda step: step % 2 == 0,
    )
    assert cpu_bound_findings(busy) == []


def test_no_input_source_without_input_bound_or_io():
    assert input_source_findings(samples(input_wait_ns=0, read_bytes=MIB)) == []
    assert input_source_findings(_input_bound()) == []  # no I/O attributes: undecided


# -- CPU ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("busy, fires", [(0.5, False), (0.84, False), (0.85, True), (1.0, True)])
def test_cpu_bound_when_all_cores_are_busy(busy, fires):
    # wall = 10 ms step + 2 ms between; 4 cores
    run = samples(between_ns=2 * MS, cpus=4, cpu_time_ns=round(busy * 4 * 12 * MS))
    found = cpu_bound_findings(run)
    assert rules(found) == (["cpu_bound"] if fires else [])
    if fires:
        assert found[0].evidence["cpu_share_by_rank"]["0"] == pytest.approx(busy, abs=1e-3)
        assert found[0].evidence["cores_by_rank"]["0"] == 4


# -- time between steps --------------------------------------------------------------------------


def _stall(step: int) -> int:
    return 100 * MS if step % 10 == 0 else 100_000


def test_callback_stall_is_time_between_steps_and_named():
    run = samples(
        30,
        duration_ns=2 * MS,
        between_ns=_stall,
        callback_ns=lambda n: 100 * MS if n % 10 == 0 else 2_000,
        checkpoint_ns=0,
        top=lambda n: (("Stall", 100.0),) if n % 10 == 0 else (),
    )
    (finding,) = between_steps_findings(run)
    assert finding.rule == "time_between_steps" and finding.severity == "high"
    assert finding.evidence["named"][0] == {"name": "Stall", "ms": 300.0, "steps": 3}
    assert finding.evidence["callbacks_ms"] == pytest.approx(300.0 + 27 * 0.002)
    assert "Stall" in finding.summary


def test_framework_gaps_below_the_floor_are_not_a_finding():
    # Keras fit's own bookkeeping: ~0.1 ms between ~1 ms steps (measured), 9 % but < 1 ms
    run = samples(duration_ns=MS, between_ns=100_000, callback_ns=2_000, checkpoint_ns=0)
    assert between_steps_findings(run) == []


@pytest.mark.parametrize("between_ms, fires", [(0.99, False), (1.0, True)])
def test_between_steps_floor(between_ms, fires):
    run = samples(duration_ns=10 * MS, between_ns=round(between_ms * MS))
    assert rules(between_steps_findings(run)) == (["time_between_steps"] if fires else [])


def test_between_steps_share_threshold():
    # 1.5 ms between 30 ms steps: 4.8 % of wall time, above the 1 ms floor
    assert between_steps_findings(samples(duration_ns=30 * MS, between_ns=1_500_000)) == []
    found = between_steps_findings(samples(duration_ns=28 * MS, between_ns=1_500_000))
    assert rules(found) == ["time_between_steps"]


# -- memory growth --------------------------------------------------------------------------------


def test_memory_growth_found_with_its_slope():
    run = samples(40, rss_bytes=lambda n: 500 * MIB + n * MIB + (3 * MIB if n % 7 == 0 else 0))
    (finding,) = memory_growth_findings(run)
    stats = finding.evidence["by_rank"]["0"]
    assert stats["mib_per_100_steps"] == pytest.approx(100.0, rel=0.01)
    assert stats["growth_share"] > 0.05


@pytest.mark.parametrize(
    "rss",
    [
        lambda n: 500 * MIB + (n % 3) * MIB,  # flat with noise
        lambda n: 500 * MIB + (50 * MIB if n >= 5 else 0),  # one early allocation
        lambda n: 500 * MIB + (50 * MIB if n >= 20 else 0),  # one in the middle
        lambda n: 500 * MIB + n * 64 * 1024,  # grows, but 2.4 MiB over 40 steps: < 5 %
        lambda n: 500 * MIB + (n * MIB if n < 30 else 0),  # grew, then was released
    ],
    ids=["flat", "early_jump", "middle_jump", "slow", "released"],
)
def test_memory_controls(rss):
    assert memory_growth_findings(samples(40, rss_bytes=rss)) == []


def test_memory_needs_enough_steps():
    assert memory_growth_findings(samples(19, rss_bytes=lambda n: 100 * MIB + n * MIB)) == []


def test_theil_sen_ignores_outliers():
    points = [(float(x), 2.0 * x) for x in range(50)]
    points[10] = (10.0, 1e9)
    points[30] = (30.0, -1e9)
    assert theil_sen_slope(points) == pytest.approx(2.0)
    assert theil_sen_slope([(float(x), float(x)) for x in range(1000)]) == pytest.approx(1.0)


# -- GPU and batch size --------------------------------------------------------------------------


def test_low_gpu_utilisation_from_hw_gpu_attribute():
    assert rules(low_gpu_findings(NO_PATH, samples(gpu_percent=35.0))) == ["low_gpu_utilization"]
    assert low_gpu_findings(NO_PATH, samples(gpu_percent=92.0)) == []
    assert low_gpu_findings(NO_PATH, samples()) == []


def test_small_batch_when_per_step_overhead_dominates():
    # batch 4, 1 ms steps, 0.5 ms of framework work between them: a third of the wall time
    run = samples(duration_ns=MS, between_ns=MS // 2, callback_ns=0, batch_size=4)
    (finding,) = small_batch_findings(run)
    assert finding.evidence["batch_sizes"] == [4]
    assert finding.evidence["framework_between_share"] == pytest.approx(1 / 3, abs=1e-3)


def test_small_batch_controls():
    base = dict(duration_ns=MS, between_ns=MS // 2, callback_ns=0)
    assert small_batch_findings(samples(**base)) == []  # batch size unknown
    # the gap is a callback, not the framework
    assert small_batch_findings(samples(**{**base, "callback_ns": MS // 2, "batch_size": 4})) == []
    # long steps: the per-step cost is amortised whatever the gap
    long = samples(duration_ns=30 * MS, between_ns=15 * MS, batch_size=4)
    assert small_batch_findings(long) == []
    assert small_batch_findings(samples(duration_ns=MS, between_ns=MS // 5, batch_size=4)) == []


# -- through the decoders, analyze_spans and the reports ---------------------------------------


def whole_step_job(attributes: Callable[[int], Dict[str, Any]], steps: int = 30) -> JobBuilder:
    job = JobBuilder("job-ws", world_size=1)
    t = 0.0
    for number in range(steps):
        step = job.step(number)
        span = step.rank(0, t, t + 10.0)
        span.attributes.update(attributes(number))
        t += 12.0
    return job


def input_bound_attributes(number: int) -> Dict[str, Any]:
    return {
        "tf_otel.input.wait_ns": 8 * MS,
        "tf_otel.input.share": 0.8,
        "tf_otel.input.elements": 1,
        "tf_otel.between_steps_ns": 2 * MS,
        "tf_otel.between_steps.callback_ns": 0,
        "tf_otel.between_steps.checkpoint_ns": 0,
        "tf_otel.io.read_bytes": 8192,
        "tf_otel.io.read_ops": 2,
        "tf_otel.process.cpu_time_ns": 3 * MS,
        "tf_otel.process.cpus": 2,
        "process.memory.usage": 400 * MIB,
    }


def test_findings_from_decoded_spans_and_in_the_json_report():
    result = analyze_spans(decoded_spans(whole_step_job(input_bound_attributes)))
    found = {f.rule: f for f in result.findings}
    assert "input_bound" in found and "decode_bound_input" in found
    assert found["input_bound"].evidence["grade"] == "highly"
    assert found["input_bound"].evidence["share"] == pytest.approx(0.8)
    assert "time_between_steps" in found  # 2 ms of 12 ms, no callback named
    assert not {"cpu_bound", "memory_growth", "small_batch", "io_bound_input"} & set(found)
    document = json.loads(json.dumps(to_json(result)))
    assert "input_bound" in [f["rule"] for f in document["findings"]]


def test_a_control_run_finds_nothing():
    def quiet(number: int) -> Dict[str, Any]:
        attributes = input_bound_attributes(number)
        attributes.update({"tf_otel.input.wait_ns": 60_000, "tf_otel.between_steps_ns": 100_000})
        return attributes

    result = analyze_spans(decoded_spans(whole_step_job(quiet)))
    assert result.findings == []


def test_step_attributes_grade_input_not_the_critical_path():
    # an input span covering most of the step (the critical path says input) but a step
    # attribute that says the wait was noise: the step attribute decides
    job = whole_step_job(lambda n: {"tf_otel.input.wait_ns": 50_000, "tf_otel.input.elements": 1})
    for step in job.steps:
        span = step.step_spans[0]
        start = (span.start_ns - job.steps[0].step_spans[0].start_ns) / 1e6
        step.span(0, "input", "IteratorGetNext", start, start + 9.0)
    result = analyze_spans(decoded_spans(job))
    assert "input_bound" not in rules(result.findings)


def test_step_spans_gpu_utilisation_decides_over_other_spans():
    # one rule, two sources: the step spans' own means where they carry them (30 % here, the
    # kernels' older samples say 95 %), else the other spans' samples
    def kernels(job: JobBuilder, percent: float) -> JobBuilder:
        for number, step in enumerate(job.steps):
            step.span(
                0,
                "kernel",
                "gemm",
                12.0 * number,
                12.0 * number + 1,
                **{"gpu.utilization": percent},
            )
        return job

    both = kernels(whole_step_job(lambda n: {"hw.gpu.utilization": 0.3}), 95.0)
    (finding,) = [
        f for f in analyze_spans(decoded_spans(both)).findings if f.rule == "low_gpu_utilization"
    ]
    assert finding.evidence["by_rank"]["0"]["p95_percent"] == 30.0
    spans_only = kernels(whole_step_job(lambda n: {}), 35.0)
    (finding,) = [
        f
        for f in analyze_spans(decoded_spans(spans_only)).findings
        if f.rule == "low_gpu_utilization"
    ]
    assert finding.evidence["p95_percent_by_rank"] == {"0": 35.0}


def test_attributes_survive_both_file_decoders(tmp_path):
    job = whole_step_job(input_bound_attributes)
    job.write_otlp(tmp_path / "spans.jsonl")
    loaded = load_paths([str(tmp_path / "spans.jsonl")], progress=False, workers=1)
    steps = [s for s in loaded if s.category == "step"]
    assert steps and all(s.attributes["tf_otel.input.wait_ns"] == 8 * MS for s in steps)
    assert all(s.attributes["tf_otel.process.cpus"] == 2 for s in steps)
    rules_found = rules(analyze_spans(loaded).findings)
    assert "input_bound" in rules_found and "decode_bound_input" in rules_found


def test_attribute_names_match_the_runtime():
    """What the runtime writes on step spans is what the analysis keeps at load."""
    from tf_otel.analysis.step_attributes import WHOLE_STEP_ATTRIBUTES
    from tf_otel.instrument import input_wait, step_resources
    from tf_otel.metrics import gpu_metrics

    written = {input_wait.ATTR_WAIT, input_wait.ATTR_ELEMENTS, gpu_metrics.UTILIZATION}
    for name in (
        "BETWEEN",
        "CALLBACK",
        "CHECKPOINT",
        "TOP",
        "READ_BYTES",
        "READ_OPS",
        "CPU_TIME",
        "CPUS",
        "MEMORY",
    ):
        written.add(getattr(step_resources, f"ATTR_{name}"))
    assert written <= WHOLE_STEP_ATTRIBUTES, written - WHOLE_STEP_ATTRIBUTES


def test_one_unnamed_stall_is_not_a_habit():
    # a scheduler stall of 30 ms once between ~1 ms steps: > 5 % and > 1 ms a step on average,
    # but nobody's callback and not recurring (step_outliers' business)
    run = samples(30, duration_ns=MS, between_ns=lambda n: 30 * MS if n == 12 else 100_000)
    assert between_steps_findings(run) == []
    recurring = samples(
        30, duration_ns=MS, between_ns=lambda n: 30 * MS if n % 10 == 2 else 100_000
    )
    (finding,) = between_steps_findings(recurring)
    assert finding.evidence["unnamed_steps"] == 3 and finding.evidence["named"] == []


def test_outlier_steps_stay_out_of_the_input_share():
    run = samples(20, input_wait_ns=9 * MS, input_elements=1)
    stalled = [StepSample(rank=0, step=20, duration_ns=1000 * MS, input_wait_ns=0, outlier=True)]
    (finding,) = input_bound_findings(NO_PATH, run + stalled)
    assert finding.evidence["share"] == pytest.approx(0.9)


def test_hiccups_on_a_loaded_host_are_not_input_bound():
    # a prefetched pipeline at load 16 (measured): ~65 us a batch in most steps, a few ms now
    # and then; mean 0.26 ms a batch, 9 % of 2.9 ms steps, median far below the floor
    run = samples(
        20,
        duration_ns=2_900_000,
        input_elements=1,
        input_wait_ns=lambda n: 2_250_000 if n in (3, 11) else 65_000,
    )
    assert input_bound_findings(NO_PATH, run) == []


def test_waits_in_some_steps_only_count_from_1_ms_on_average():
    # every 5th step waits: the median step does not, the mean passes the sporadic floor
    waits = {"input_elements": 1, "duration_ns": 20 * MS}
    run = samples(20, input_wait_ns=lambda n: 6 * MS if n % 5 == 0 else 0, **waits)
    (finding,) = input_bound_findings(NO_PATH, run)  # 1.2 ms a batch on average, 6 % of step time
    assert finding.evidence["by_rank"]["0"]["median_wait_per_batch_ms"] == 0
    assert finding.evidence["grade"] == "moderately"
    # 0.8 ms a batch on average, 8 % of 10 ms steps: below both floors
    under = samples(20, input_wait_ns=lambda n: 4 * MS if n % 5 == 0 else 0, input_elements=1)
    assert input_bound_findings(NO_PATH, under) == []
