"""The analysis never claims what it did not measure: a category whose source was off in a step
is "not measured" there (table, JSON, HTML), shares are over the steps that measured it, and no
finding rests on an unmeasured category (tf_otel/analysis/measured.py)."""

from __future__ import annotations

from typing import Iterable, List, Optional

import pytest
from analysis_builders import JobBuilder, decoded_spans

from tf_otel.analysis.analyze import analyze_spans
from tf_otel.analysis.measured import (
    COMMUNICATION_SETTING,
    INPUT_SETTING,
    measured_categories,
)
from tf_otel.analysis.report.html import render_html
from tf_otel.analysis.report.json_report import to_json
from tf_otel.analysis.report.terminal import render_table
from tf_otel.analysis.result import AnalysisResult
from tf_otel.analysis.steps import StepTrace, group_steps

INPUT_WAIT = "tf_otel.input.wait_ns"


def job(
    steps: int = 8,
    ranks: int = 2,
    world_size: Optional[int] = None,
    input_spans: Iterable[int] = (),
    collectives: Iterable[int] = (),
    input_wait: Optional[int] = None,
    wait_ranks: Optional[Iterable[int]] = None,
) -> JobBuilder:
    """Steps of 100 ms per rank: input 0-20 ms (an ``input`` span on the steps in
    ``input_spans``; else unseen, inside the rank's step work), the rank's step work (no op
    spans) and, on the steps in ``collectives``, an allreduce 60-100 ms. ``input_wait``: that
    ``tf_otel.input.wait_ns`` on the step spans of ``wait_ranks`` (default every rank)."""
    built = JobBuilder("job-m", world_size=ranks if world_size is None else world_size)
    with_input, with_collective = set(input_spans), set(collectives)
    waiting = set(range(ranks) if wait_ranks is None else wait_ranks)
    for number in range(steps):
        step = built.step(number)
        base = number * 200
        for rank in range(ranks):
            span = step.rank(rank, base, base + 100)
            if input_wait is not None and rank in waiting:
                span.attributes[INPUT_WAIT] = input_wait
            if number in with_input:
                step.span(rank, "input", "IteratorGetNext", base, base + 20)
            if number in with_collective:
                step.collective(rank, f"g{number}", base + 60, base + 100)
    return built


def analyse(built: JobBuilder) -> AnalysisResult:
    return analyze_spans(decoded_spans(built), source="built")


def category_row(table: str, category: str) -> str:
    """The line of the table's split by category for ``category``."""
    head = table.index("critical path by category")
    return next(line for line in table[head:].splitlines() if line.split()[:1] == [category])


def rules(result: AnalysisResult) -> List[str]:
    return [f.rule for f in result.findings]


def test_input_without_wait_attribute_or_spans_is_not_measured_in_every_report():
    result = analyse(job(collectives=range(8)))
    assert all("input" not in step.measured for step in result.steps)
    table = render_table(result)
    row = category_row(table, "input")
    assert "not measured" in row and "0/8" in row and "%" not in row
    assert f"input ({INPUT_SETTING})" in table
    # compute holds the unseen input wait: marked, never shown as pure compute
    assert "+: compute holds input wait on 8 of 8 steps" in table
    assert category_row(table, "compute").split()[2].endswith("%+")
    document = to_json(result)
    summary = document["summary"]
    assert summary["critical_path_share"]["input"] is None
    assert summary["critical_path_ms"]["input"] is None
    assert summary["categories"]["input"] == {
        "status": "not measured",
        "measured_steps": 0,
        "steps": 8,
        "share": None,
        "critical_path_ms": None,
        "setting": INPUT_SETTING,
    }
    assert summary["categories"]["compute"]["holds_not_measured"] == ["input"]
    for step in document["steps"]:
        assert step["critical_path_by_category_ms"]["input"] is None
        assert step["not_measured"] == {"input": INPUT_SETTING}
    page = render_html(result)
    assert f"input not measured ({INPUT_SETTING})" in page  # each pictured step
    assert "id='measured'" in page and f"not measured ({INPUT_SETTING})" in page
    assert "input 0%" not in page
    assert "input_bound" not in rules(result)


def test_input_wait_attribute_zero_is_measured_zero():
    result = analyse(job(collectives=range(8), input_wait=0))
    assert all("input" in step.measured for step in result.steps)
    row = category_row(render_table(result), "input")
    assert "0.0%" in row and "8/8" in row and "not measured" not in row
    categories = to_json(result)["summary"]["categories"]
    assert categories["input"]["status"] == "measured"
    assert categories["input"]["share"] == 0.0
    assert "holds_not_measured" not in categories["compute"]
    assert to_json(result)["steps"][0]["critical_path_by_category_ms"]["input"] == 0.0
    # one rank's step span without the attribute: that rank's wait was not measured
    partial = analyse(job(collectives=range(8), input_wait=0, wait_ranks=[0]))
    assert all("input" not in step.measured for step in partial.steps)


def test_input_share_is_over_the_steps_that_measured_it():
    result = analyse(job(input_spans=range(4), collectives=range(8)))
    assert [("input" in s.measured) for s in result.steps] == [True] * 4 + [False] * 4
    found = result.category_shares()["input"]
    assert (found.measured_steps, found.steps) == (4, 8)
    assert found.share == 0.2  # 20 of 100 ms on the 4 measured steps, not 10 % over all 8
    document = to_json(result)
    assert document["summary"]["critical_path_share"]["input"] == 0.2
    assert document["summary"]["categories"]["input"]["status"] == "partly measured"
    assert document["steps"][0]["critical_path_by_category_ms"]["input"] == 20.0
    assert document["steps"][5]["critical_path_by_category_ms"]["input"] is None
    table = render_table(result)
    assert "20.0%" in category_row(table, "input") and "4/8" in category_row(table, "input")
    step_row = next(line for line in table.splitlines() if line.startswith("  5 "))
    assert "n/m" in step_row
    # the finding judges the measured steps (20 % >= 15 %) and says over which
    (finding,) = [f for f in result.findings if f.rule == "input_bound"]
    assert finding.evidence["share"] == 0.2
    assert (finding.evidence["measured_steps"], finding.evidence["steps"]) == (4, 8)
    assert "over the 4 of 8 steady steps where it was measured" in finding.summary


@pytest.mark.parametrize("measured, severity", [(1, "low"), (2, "low"), (3, "high"), (8, "high")])
def test_a_share_measured_on_few_steps_is_graded_low(measured, severity):
    """Communication is 40 % of every step where it is measured; measured on fewer than 3
    steady steps (tf_cnn_benchmarks' default detail sampled 1 of 26) the finding still says
    so, over how many, but graded low."""
    result = analyse(job(steps=8, collectives=range(measured)))
    (finding,) = [f for f in result.findings if f.rule == "communication_bound"]
    assert finding.evidence["share"] == 0.4 and finding.evidence["measured_steps"] == measured
    assert finding.severity == severity
    assert ("graded low" in finding.summary) == (severity == "low")


def test_two_ranks_without_collectives_never_show_communication_as_zero():
    result = analyse(job(input_spans=range(8)))
    assert all("communication" not in step.measured for step in result.steps)
    table = render_table(result)
    for category in ("communication", "straggler_wait"):
        row = category_row(table, category)
        assert "not measured" in row and "%" not in row, row
    assert f"communication, straggler_wait ({COMMUNICATION_SETTING})" in table
    step_row = next(line for line in table.splitlines() if line.startswith("  3 "))
    assert step_row.split()[4:6] == ["n/m", "n/m"]  # comm, wait
    summary = to_json(result)["summary"]
    assert summary["critical_path_share"]["communication"] is None
    assert summary["categories"]["communication"]["status"] == "not measured"
    assert summary["categories"]["communication"]["setting"] == COMMUNICATION_SETTING
    page = render_html(result)
    assert f"communication not measured ({COMMUNICATION_SETTING})" in page
    assert "communication 0%" not in page
    assert "communication_bound" not in rules(result)


def test_collectives_on_some_steps_measure_communication_on_those_steps():
    result = analyse(job(steps=10, input_spans=range(10), collectives=range(4)))
    assert [("communication" in s.measured) for s in result.steps] == [True] * 4 + [False] * 6
    found = result.category_shares()["communication"]
    assert (found.measured_steps, found.share) == (4, 0.4)  # 40 of 100 ms, not 16 % over all
    assert to_json(result)["summary"]["categories"]["communication"]["status"] == (
        "partly measured"
    )
    (finding,) = [f for f in result.findings if f.rule == "communication_bound"]
    assert finding.evidence["share"] == 0.4 and finding.evidence["measured_steps"] == 4


def test_single_rank_job_measures_communication_as_zero():
    result = analyse(job(ranks=1, input_spans=range(6), steps=6))
    assert all("communication" in step.measured for step in result.steps)
    categories = to_json(result)["summary"]["categories"]
    assert categories["communication"]["status"] == "measured"
    assert categories["communication"]["share"] == 0.0
    assert "0.0%" in category_row(render_table(result), "communication")
    # one rank seen of a job of two: the other's part is unseen, not 0
    alone = analyse(job(ranks=1, world_size=2, input_spans=range(6), steps=6))
    assert all("communication" not in step.measured for step in alone.steps)


def test_transfer_spans_measure_communication():
    def worker_step(transfer: bool) -> StepTrace:
        built = JobBuilder("ps", world_size=2)  # a worker and a parameter server
        step = built.step(1)
        step.rank(0, 0, 60)
        if transfer:
            step.span(0, "transfer", "RecvTensor w", 0, 50, **{"tensorflow.transfer.edge": "e"})
        step.span(0, "compute", "apply", 50, 60)
        (trace,), _ = group_steps(decoded_spans(built))
        return trace

    assert "communication" in measured_categories(worker_step(transfer=True))
    assert "communication" not in measured_categories(worker_step(transfer=False))


def test_straggler_cause_compute_says_what_it_holds():
    def straggling(input_spans: bool) -> AnalysisResult:
        built = JobBuilder("j", world_size=2)
        for number in range(12):
            step = built.step(number)
            base = number * 200
            delay = 30.0 if number in (3, 7) else 0.0
            for rank in range(2):
                late = delay if rank == 1 else 0.0
                step.rank(rank, base, base + 100 + delay)
                if input_spans:
                    step.span(rank, "input", "next", base, base + 5)
                step.collective(rank, f"g{number}", base + 60 + late, base + 100 + delay)
        return analyse(built)

    unmeasured = straggling(input_spans=False)
    (finding,) = [f for f in unmeasured.findings if f.rule == "straggler"]
    assert "compute holds input wait: not measured" in finding.summary
    assert finding.evidence["compute_holds_not_measured"] == {"input": INPUT_SETTING}
    assert "compute+" in render_table(unmeasured)  # the step rows' straggler cause
    measured = straggling(input_spans=True)
    (finding,) = [f for f in measured.findings if f.rule == "straggler"]
    assert "not measured" not in finding.summary
    assert "compute_holds_not_measured" not in finding.evidence
