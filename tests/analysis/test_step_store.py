"""analysis.step_store: steps pickled to one temporary file and read back one at a time."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path
from typing import Dict, List

import pytest

from tf_otel.analysis.outliers import OutlierStats
from tf_otel.analysis.path.critical_path import CriticalPath, Segment
from tf_otel.analysis.result import AnalysisResult, StepMarks, StepResult
from tf_otel.analysis.step_store import Paged, PagedSteps
from tf_otel.analysis.steps import RankTimeline, StepTrace
from tf_otel.analysis.stragglers import StepStraggler, StragglerSummary


def test_items_come_back_equal_and_new(tmp_path: Path) -> None:
    pages: Paged[Dict[str, List[int]]] = Paged(tmp_path)
    items = [{"step": [n] * n} for n in range(5)]
    assert [pages.append(item) for item in items] == [0, 1, 2, 3, 4]
    assert len(pages) == 5
    assert list(pages) == items
    assert pages[-1] == items[4]
    assert pages[2] is not pages[2]  # each read is a new copy: a change is not kept
    assert os.listdir(tmp_path) == []  # the file is unlinked from the start
    pages.close()


def test_a_stored_change_replaces_the_item(tmp_path: Path) -> None:
    pages: Paged[List[int]] = Paged(tmp_path)
    for n in range(3):
        pages.append([n])
    pages[1] = [10, 11, 12]
    pages[-1] = [20]
    assert list(pages) == [[0], [10, 11, 12], [20]]


def test_slices_and_views_read_when_asked(tmp_path: Path) -> None:
    pages: Paged[int] = Paged(tmp_path)
    for n in range(10):
        pages.append(n)
    view = pages[2:8:2]
    assert len(view) == 3 and list(view) == [2, 4, 6]
    assert view[1] == 4 and list(view[1:]) == [4, 6]


@pytest.mark.parametrize("index", [3, -4])
def test_an_index_out_of_range_names_itself(tmp_path: Path, index: int) -> None:
    pages: Paged[int] = Paged(tmp_path)
    for n in range(3):
        pages.append(n)
    with pytest.raises(IndexError, match=f"step {index} of 3"):
        pages[index]


def _step(key: int, warmup: bool, ranks: int = 2) -> StepResult:
    """A small analysed step: ``key`` ms long, its path compute on rank 0 and input on 1."""
    timelines = {r: RankTimeline(r, 0, key * 1_000_000, None) for r in range(ranks)}
    trace = StepTrace(f"t{key}", key, None, None, 0, key * 1_000_000, timelines, ranks, [])
    half = key * 500_000
    segments = [Segment(0, 0, half, "compute", "op"), Segment(1, half, 2 * half, "input", "get")]
    return StepResult(key, trace, CriticalPath(trace, segments), warmup=warmup)


def test_warm_up_marks_filter_without_reading_every_step(tmp_path: Path) -> None:
    steps = PagedSteps(tmp_path)
    for key in range(6):
        steps.append(_step(key, key < 2))
    assert [s.key for s in steps.where(warmup=True)] == [0, 1]
    assert [s.key for s in steps.where(warmup=False)] == [2, 3, 4, 5]
    steps[3] = _step(3, True)
    assert [s.key for s in steps.where(warmup=False)] == [2, 4, 5]


def test_the_sums_over_steps_read_no_step_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reports' sums (durations, path by category and rank, shares, ranks) come from the
    digests in memory, and equal the sums over the steps themselves."""
    paged = PagedSteps(tmp_path)
    listed = []
    for key in range(1, 7):
        paged.append(_step(key, key < 3, ranks=2 + key % 3))
        listed.append(_step(key, key < 3, ranks=2 + key % 3))
    reads = []
    original = Paged.__getitem__
    monkeypatch.setattr(Paged, "__getitem__", lambda *a: reads.append(a) or original(*a))
    on_disk = AnalysisResult("t", None, paged, StragglerSummary(), OutlierStats())
    in_memory = AnalysisResult("t", None, listed, StragglerSummary(), OutlierStats())
    for result in (on_disk, in_memory):
        assert result.total_ns == 21_000_000 and result.what_if_total_ns == 21_000_000
        assert result.by_category()["compute"] == result.by_category()["input"] == 9_000_000
        assert result.by_rank() == {0: 9_000_000, 1: 9_000_000}  # steady steps 3 to 6
        assert result.ranks() == [0, 1, 2, 3]
        assert result.category_shares()["compute"].share == pytest.approx(0.5)
    assert reads == []
    # equal ranks are one tuple in memory
    assert paged.digests()[0].ranks is paged.digests()[3].ranks
    # the noise model's input, each step's lateness by rank, kept whole
    for digest, step in zip(paged.digests(), listed):
        assert digest.lateness() == step.path.lateness_by_rank()


def test_marks_go_on_every_read_and_a_step_stored_again_keeps_its_own(tmp_path: Path) -> None:
    """The statistics' marks (warm-up, series, straggler, outlier) are kept in memory and put on
    the step at each read, the digest following them (its what-if saving); the step is not
    written again. A step stored after it was marked is read back as stored."""
    steps = PagedSteps(tmp_path)
    for key in range(4):
        steps.append(_step(key + 1, warmup=False))
    written = steps._end
    straggler = StepStraggler(1, 1_500_000, 1_000_000, "input", {"input": 1_500_000})
    steps.mark(2, StepMarks(warmup=False, series="eval", straggler=straggler, outlier=True))
    steps.mark(0, StepMarks(warmup=True, series=None, straggler=None, outlier=False))
    assert steps._end == written, "marking writes nothing"
    for _ in range(2):  # every read, not the first alone
        step = steps[2]
        assert (step.series, step.straggler, step.outlier) == ("eval", straggler, True)
        assert step.label == "eval:3" and step.what_if_ns == 2_000_000
    assert steps[0].warmup and not steps[1].warmup and steps[1].straggler is None
    assert [s.key for s in steps.where(warmup=False)] == [1, 2, 3]  # a step's key: its place
    assert steps.digests()[2].what_if_ns == 2_000_000 and steps.digests()[2].warmup is False
    assert steps.digests()[0].warmup is True
    again = steps[2]
    again.outlier = False
    steps[2] = again
    assert steps[2].outlier is False and steps[2].straggler == straggler


def test_a_report_reads_a_step_back_three_times_not_once_a_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tf-otel analyze with its steps on disk: the statistics, the findings and the JSON report
    read an analysed step back three times (the straggler summary's second pass, the whole-step
    samples, the report's steps; a straggler step a few more, for its label), not once a pass
    (14 before the passes read the steps' digests); the same report as with every step in
    memory."""
    import json
    import sys

    from tf_otel.analysis import analyze
    from tf_otel.analysis.load.files import load_paths
    from tf_otel.analysis.load.spill import load_spilled
    from tf_otel.analysis.report.json_report import to_json

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import bench_analysis

    steps = 12
    bench_analysis.generate(tmp_path, steps=steps, ranks=4)
    reads: Dict[int, int] = {}
    original = PagedSteps._loaded

    def counted(self: PagedSteps, index: int, item: StepResult) -> StepResult:
        reads[index] = reads.get(index, 0) + 1
        return original(self, index, item)

    monkeypatch.setattr(PagedSteps, "_loaded", counted)
    with load_spilled([str(tmp_path)], progress=False, workers=1) as source:
        result = analyze.analyze_source(source, source="t")
        assert isinstance(result.steps, PagedSteps)
        report = json.dumps(to_json(result))
    stragglers = set(result.stragglers.step_stragglers)  # rank 3 late in steps 0 and 10
    assert stragglers and len(reads) == steps, reads
    assert all(reads[n] <= 3 for n in range(steps) if n not in stragglers), reads
    assert sum(reads.values()) <= 4 * steps, reads
    for n in range(steps):  # the noise model's input in memory: each step's lateness whole
        late = result.steps[n].path.lateness_by_rank()
        assert len(late) == 4 and result.steps.digest(n).lateness() == late
    in_memory = analyze.analyze_spans(load_paths([str(tmp_path)], progress=False), source="t")
    assert isinstance(in_memory.steps, list)
    assert json.dumps(to_json(in_memory)) == report


def test_steps_stored_out_of_order_are_put_in_order_without_reading_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``select``: steps analysed in another order than the selection's (some not selected
    after all) are indexed anew; each reads back with its new place as its key, its digest with
    it, and nothing is read or written to do it."""
    steps = PagedSteps(tmp_path)
    for number in (5, 3, 9, 4):  # stored in the order they were analysed
        steps.append(_step(number, warmup=False))
    written, reads = steps._end, []
    original = Paged.__getitem__
    monkeypatch.setattr(Paged, "__getitem__", lambda *a: reads.append(a) or original(*a))
    steps.select([1, 3, 0])  # the selection: 3, 4, 5 (9 left out)
    assert reads == [] and steps._end == written
    monkeypatch.undo()
    assert len(steps) == 3
    assert [(s.key, s.trace.step) for s in steps] == [(0, 3), (1, 4), (2, 5)]
    assert [d.duration_ns for d in steps.digests()] == [3_000_000, 4_000_000, 5_000_000]
    steps.mark(0, StepMarks(warmup=True, series=None, straggler=None, outlier=False))
    with pytest.raises(ValueError, match="marked before"):
        steps.select([0, 1])


def test_a_span_comes_back_whole_and_shares_what_it_shared() -> None:
    """Span pickles as its fields and one call back (``Span.__reduce__``): every field comes back,
    and the attribute and resource dicts spans shared are one object again."""
    import pickle

    from tf_otel.analysis.model import Span

    resource = {"tf_otel.rank": 3, "service.name": "train"}
    attributes = {"tf_otel.category": "collective", "tf_otel.step": 7, "gpu.utilization": 0.5}
    spans = [
        Span("a" * 32, f"{n:016x}", "b" * 16, f"op{n}", 10 + n, 20 + n, attributes, resource)
        for n in range(3)
    ]
    spans.append(Span("a" * 32, "f" * 16, None, "root", 1, 99, {}, {}))
    back = pickle.loads(pickle.dumps(spans, pickle.HIGHEST_PROTOCOL))
    assert [s.to_row() for s in back] == [s.to_row() for s in spans]
    assert back[0].rank == 3 and back[0].step == 7 and back[0].category == "collective"
    assert back[3].parent_id is None and back[3].rank is None
    assert back[0].attributes is back[2].attributes and back[0].resource is back[1].resource


def test_memory_holds_two_numbers_an_item(tmp_path: Path) -> None:
    # a 10 KB item each: 1,000 of them stay on disk, not in memory
    pages: Paged[bytes] = Paged(tmp_path)
    tracemalloc.start()
    try:
        for n in range(1000):
            pages.append(bytes([n % 256]) * 10_000)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 100_000, held  # against 10 MB of items
    assert pages[999] == bytes([999 % 256]) * 10_000
