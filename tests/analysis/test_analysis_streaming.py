"""Analysis in bounded memory: trace files spilled by trace, one step analysed at a time.

The spilled analysis must give exactly the in-memory analysis's answers (JSON report with the
critical paths, the HTML pictures, the errors), and its peak memory must not grow with the
number of steps the way the in-memory analysis's does (tracemalloc; no timing).
"""

from __future__ import annotations

import gzip
import json
import sys
import tracemalloc
from functools import partial
from pathlib import Path
from typing import Callable, Dict, List

import pytest

from tf_otel.analysis.analyze import analyze_source, analyze_spans
from tf_otel.analysis.engine import DaskEngine, InProcess, open_engine
from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.load import spill
from tf_otel.analysis.load.files import load_paths
from tf_otel.analysis.load.spill import load_spilled
from tf_otel.analysis.path.critical_path import critical_path
from tf_otel.analysis.report.html import render_html
from tf_otel.analysis.report.json_report import to_json
from tf_otel.analysis.report.terminal import render_table
from tf_otel.analysis.result import AnalysisResult
from tf_otel.analysis.rules.gc_pause import paused_gc
from tf_otel.analysis.steps import group_steps
from tf_otel.analysis.stragglers import keep_for_statistics, step_straggler
from tf_otel.lateness import StragglerNoise

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_analysis  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden"


def _generate(directory: Path, steps: int, ranks: int = 4) -> Path:
    bench_analysis.generate(directory, steps=steps, ranks=ranks, job="stream-job")
    return directory


def _in_memory(path: Path) -> AnalysisResult:
    return analyze_spans(load_paths([str(path)], progress=False, workers=1), source="t")


def _report(result: AnalysisResult) -> str:
    return json.dumps(to_json(result, True), indent=1)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("case", ["synth", "perturbed", "demo"])
def test_spilled_analysis_equals_the_in_memory_one(
    case: str, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # small blocks: each trace is spilled in many pieces, across block and part boundaries
    monkeypatch.setattr(spill, "BLOCK_BYTES", 3000)
    expected = _in_memory(GOLDEN / case)
    # workers=2: Dask's local cluster decodes, builds and analyses (engine.DaskEngine)
    with open_engine(workers) as engine:
        assert isinstance(engine, DaskEngine if workers > 1 else InProcess)
        with load_spilled([str(GOLDEN / case)], progress=False, engine=engine) as source:
            assert len(source.trace_ids()) > 1
            result = analyze_source(source, source="t", engine=engine)
            assert all(step.trace.slimmed for step in result.steps)
            assert _report(result) == _report(expected)
            assert render_html(result) == render_html(expected)  # pictures: read again
            # without --with-path each step keeps its path's totals only: the same report
            totals = analyze_source(source, source="t", engine=engine, keep_segments=False)
            assert not any(step.path.segments for step in totals.steps)
            assert json.dumps(to_json(totals)) == json.dumps(to_json(expected))
            assert render_table(totals) == render_table(expected)
            assert render_html(totals) == render_html(expected)
    assert not source.directory.exists()  # the spill is removed on close


def test_a_bad_line_is_named_as_the_in_memory_loader_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spill, "BLOCK_BYTES", 3000)
    lines = gzip.decompress((GOLDEN / "synth" / "rank1.jsonl.gz").read_bytes()).splitlines()
    lines[3] = lines[3][: len(lines[3]) // 2]  # a truncated line in the middle
    (tmp_path / "rank1.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    assert "line 4" in _the_same_error_both_ways(tmp_path)


def _the_same_error_both_ways(path: Path) -> str:
    """The error loading ``path`` in memory gives, which the spilled load must give too."""
    with pytest.raises(AnalysisError) as in_memory:
        load_paths([str(path)], progress=False, workers=1)
    with pytest.raises(AnalysisError) as spilled:
        load_spilled([str(path)], progress=False, workers=1)
    assert str(spilled.value) == str(in_memory.value)
    return str(spilled.value)


def _peak(run: Callable[[], object]) -> int:
    with paused_gc():
        tracemalloc.start()
        try:
            run()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


def _spilled(path: Path) -> Callable[[], object]:
    def run() -> object:
        with load_spilled([str(path)], progress=False, workers=1) as source:
            return analyze_source(source, source="t")

    return run


def test_peak_memory_does_not_grow_with_the_steps(tmp_path: Path) -> None:
    short = _generate(tmp_path / "short", 10)
    long = _generate(tmp_path / "long", 40)
    peaks: Dict[str, List[int]] = {
        "spilled": [_peak(_spilled(short)), _peak(_spilled(long))],
        "in memory": [_peak(lambda: _in_memory(short)), _peak(lambda: _in_memory(long))],
    }
    growth = {name: (late - early) / early for name, (early, late) in peaks.items()}
    # the control: loading every span first grows with the job (4x the steps: ~3x the peak)
    assert growth["in memory"] > 1.5, peaks
    assert growth["spilled"] < 0.25 * growth["in memory"], peaks


def test_export_peak_memory_does_not_grow_with_the_steps(tmp_path: Path) -> None:
    # tf-otel export keeps the input on disk by trace and builds a step at a time to choose;
    # the control (every span loaded) grows ~3x for 4x the steps; export grew 2.1x here when
    # it loaded every span and read each file whole for the attributes
    from tf_otel.cli import main as tf_otel_main

    short = _generate(tmp_path / "short", 10)
    long = _generate(tmp_path / "long", 40)

    def export(path: Path) -> Callable[[], object]:
        out = str(tmp_path / f"{path.name}.json")
        return lambda: tf_otel_main(["export", str(path), "--max-steps", "2", "-o", out])

    export(short)()  # modules imported and caches filled outside the measured runs
    peaks = [_peak(export(short)), _peak(export(long))]
    loaded = [_peak(lambda: _in_memory(short)), _peak(lambda: _in_memory(long))]
    growth = (peaks[1] - peaks[0]) / peaks[0]
    control = (loaded[1] - loaded[0]) / loaded[0]
    assert control > 1.5, loaded
    # what grows is the decoding block, up to its 8 MiB: these files are smaller than one
    assert growth < 0.25 * control, (peaks, loaded)


def _held(run: Callable[[], object]) -> int:
    """The memory what ``run`` returned still holds once it returned."""
    with paused_gc():
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            kept = run()
            held = tracemalloc.get_traced_memory()[0] - before
            del kept
            return held
        finally:
            tracemalloc.stop()


def test_the_analysed_steps_wait_on_disk(tmp_path: Path) -> None:
    # spilled, a result holds a few values a step in memory (its steps are read back from
    # disk, step_store); the control, the same analysis of spans in memory, holds its steps
    short = _generate(tmp_path / "short", 10)
    long = _generate(tmp_path / "long", 40)
    spilled: List[int] = []
    for path in (short, long):
        with load_spilled([str(path)], progress=False, workers=1) as source:
            spilled.append(_held(lambda: analyze_source(source, source="t")))
    spans = {path: load_paths([str(path)], progress=False) for path in (short, long)}
    in_memory = [_held(partial(analyze_spans, spans[path], source="t")) for path in (short, long)]
    per_step = {
        "spilled": (spilled[1] - spilled[0]) / 30,
        "in memory": (in_memory[1] - in_memory[0]) / 30,
    }
    assert per_step["in memory"] > 2_000, per_step  # 4 ranks: their step spans and paths
    assert per_step["spilled"] < 0.2 * per_step["in memory"], per_step


def test_a_straggler_step_without_a_kept_split_is_read_again() -> None:
    (before,) = [s for s in _steps() if s.step == 10]
    (again,) = [s for s in _steps() if s.step == 10]
    full = critical_path(again)
    path = critical_path(before)
    keep_for_statistics(path, min_ns=10**12)  # a floor nothing passes: no split kept
    assert path.top_split is None
    before.slim()
    noise = StragglerNoise(0, 0, 1, 0)
    found = step_straggler(path, noise, with_spans=lambda: full)
    assert found is not None and found.rank == bench_analysis.SLOW_RANK
    assert found == step_straggler(critical_path(_steps_by_number()[10]), noise)


def _steps() -> list:
    spans = load_paths([str(GOLDEN / "synth")], progress=False, workers=1)
    return group_steps(spans)[0]


def _steps_by_number() -> dict:
    return {step.step: step for step in _steps()}


def test_a_truncated_gzip_file_is_named_as_the_in_memory_loader_names_it(tmp_path: Path) -> None:
    data = (GOLDEN / "synth" / "rank0.jsonl.gz").read_bytes()
    (tmp_path / "rank0.jsonl.gz").write_bytes(data[: len(data) // 2])
    assert "rank0.jsonl.gz: cannot read" in _the_same_error_both_ways(tmp_path)
