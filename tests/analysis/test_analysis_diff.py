"""``tf-otel diff`` against the truth of simulated runs (job_simulator.py): an input slowed by
20 ms a batch, a layer twice as wide, one rank's compute +50 % every step, and the same
program again (the control), each named with its category / rank and size within 20 % of the
simulator's; other shapes (more ranks, saved reports) compare."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from analysis_builders import decoded_spans
from job_simulator import DataParallel
from test_analysis_backends import server  # noqa: F401  (the backend fixture)

from tf_otel.analysis.analyze import analyze_spans
from tf_otel.analysis.compare.diff import diff_profiles
from tf_otel.analysis.compare.profile import run_profile

STEPS = 30


def _profile(sim: DataParallel, seed: int) -> dict:
    job = sim.job(jitter_us=50, overlap_us=20, seed=seed)
    return run_profile(analyze_spans(decoded_spans(job)))


def _moved(report: dict) -> dict:
    return {r["category"]: r["delta_ms"] for r in report["by_category"] if r.get("moved")}


def _ranks_moved(report: dict) -> dict:
    return {
        r["candidate_rank"]: r["work_delta_ms"] for r in report["by_rank"]["ranks"] if r["moved"]
    }


@pytest.fixture(scope="module")
def baseline() -> dict:
    return _profile(DataParallel(ranks=4, steps=STEPS, input_ms=2.0, seed=1), seed=2)


def test_the_control_is_no_change_and_names_nothing(baseline):
    report = diff_profiles(
        baseline, _profile(DataParallel(ranks=4, steps=STEPS, input_ms=2.0, seed=9), 3)
    )
    verdict = report["verdict"]
    assert verdict["change"] == "no change", verdict
    assert not report["moved"] and not _moved(report) and not _ranks_moved(report), report
    assert not report["findings"]["only_candidate"], report["findings"]
    # the threshold is stated and no wider than the runs' own step-to-step spread
    assert (
        0
        < verdict["threshold_ms"]
        <= max(verdict["baseline_sigma_ms"], verdict["candidate_sigma_ms"])
    )


def test_an_input_slowed_by_20_ms_a_batch_is_input(baseline):
    sim = DataParallel(ranks=4, steps=STEPS, input_ms=22.0, seed=9)
    report = diff_profiles(baseline, _profile(sim, 3))
    assert report["verdict"]["change"] == "slower"
    assert list(_moved(report)) == ["input"], report["by_category"]
    assert _moved(report)["input"] == pytest.approx(20.0, rel=0.2)
    assert report["verdict"]["delta_ms"] == pytest.approx(20.0, rel=0.2)
    assert report["moved"][0].startswith("input +")


def test_a_layer_twice_as_wide_is_compute_on_every_rank(baseline):
    sim = DataParallel(ranks=4, steps=STEPS, input_ms=2.0, work_ms=40.0, seed=9)
    report = diff_profiles(baseline, _profile(sim, 3))
    assert list(_moved(report)) == ["compute"], report["by_category"]
    assert _moved(report)["compute"] == pytest.approx(20.0, rel=0.2)
    assert sorted(_ranks_moved(report)) == [0, 1, 2, 3]
    assert "every rank" in report["moved"][0]


def test_one_ranks_compute_plus_half_is_named_with_its_rank(baseline):
    sim = DataParallel(ranks=4, steps=STEPS, input_ms=2.0, slow={2: 1.5}, seed=9)
    report = diff_profiles(baseline, _profile(sim, 3))
    assert list(_moved(report)) == ["compute"], report["by_category"]
    assert list(_ranks_moved(report)) == [2]
    assert _ranks_moved(report)[2] == pytest.approx(10.0, rel=0.2)  # +50 % of its 20 ms
    assert "rank 2's own work" in report["moved"][0]
    rules = {(f["rule"], tuple(f["ranks"])) for f in report["findings"]["only_candidate"]}
    assert ("persistent_lateness", (2,)) in rules


def test_another_number_of_ranks_is_matched_by_role(baseline):
    sim = DataParallel(ranks=8, steps=STEPS, input_ms=2.0, seed=9)
    report = diff_profiles(baseline, _profile(sim, 3))
    assert report["by_rank"]["matched_by"] == "role"
    assert [r["label"] for r in report["by_rank"]["ranks"]] == [
        "rank 0",
        "median rank",
        "slowest rank",
    ]
    assert report["verdict"]["change"] == "no change", report["verdict"]
    assert any("another number of ranks" in note for note in report["notes"])


def test_the_cli_diffs_a_saved_report_against_trace_files(tmp_path):
    base, slow = tmp_path / "base", tmp_path / "slow"
    base.mkdir()
    slow.mkdir()
    DataParallel(ranks=4, steps=STEPS, input_ms=2.0, seed=1).job(jitter_us=50).write_otlp(
        base / "spans.jsonl"
    )
    DataParallel(ranks=4, steps=STEPS, input_ms=2.0, slow={1: 1.5}, seed=9).job(
        jitter_us=50
    ).write_otlp(slow / "spans.jsonl")
    cli = [sys.executable, "-m", "tf_otel.cli"]
    saved = subprocess.run(
        cli + ["analyze", str(base), "--format", "json"], capture_output=True, text=True, check=True
    ).stdout
    (tmp_path / "base.json").write_text(saved)
    done = subprocess.run(
        cli + ["diff", str(tmp_path / "base.json"), str(slow), "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(done.stdout)
    assert report["verdict"]["change"] == "slower"
    assert [r["candidate_rank"] for r in report["by_rank"]["ranks"] if r["moved"]] == [1]
    table = subprocess.run(
        cli + ["diff", str(base), str(slow)], capture_output=True, text=True, check=True
    ).stdout
    assert "SLOWER" in table and "rank 1's own work" in table
    bad = subprocess.run(
        cli + ["diff", str(tmp_path / "nope"), str(slow)], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "nope: no such file" in bad.stderr


def _report(cli: list, folder) -> str:
    return subprocess.run(
        cli + ["analyze", str(folder), "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_the_html_draws_both_typical_steps_on_one_scale(tmp_path):
    """``--html``: both runs' typical steps (the steady step nearest each median) drawn one
    above the other on one time scale, the slower run's step filling the width; a side given
    as a saved report is said not drawn."""
    import re

    base, slow = tmp_path / "base", tmp_path / "slow"
    base.mkdir()
    slow.mkdir()
    DataParallel(ranks=3, steps=12, input_ms=2.0, seed=1).job(jitter_us=50).write_otlp(
        base / "spans.jsonl"
    )
    DataParallel(ranks=3, steps=12, input_ms=2.0, work_ms=40.0, seed=9).job(
        jitter_us=50
    ).write_otlp(slow / "spans.jsonl")
    cli = [sys.executable, "-m", "tf_otel.cli"]
    page = tmp_path / "diff.html"
    done = subprocess.run(
        cli + ["diff", str(base), str(slow), "--html", str(page)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    heads = re.findall(r"<h3>(baseline|candidate): [^,]+, step (\d+), ([0-9.]+) ms", text)
    assert [h[0] for h in heads] == ["baseline", "candidate"], heads
    reports = {
        side: _report(cli, folder) for side, folder in (("baseline", base), ("candidate", slow))
    }
    profiles = {side: json.loads(report)["profile"]["step_ms"] for side, report in reports.items()}
    for side, _, drawn_ms in heads:  # nearest its own run's median
        assert abs(float(drawn_ms) - profiles[side]["median"]) <= 0.1 * profiles[side]["median"]
    scales = re.findall(r'text-anchor="end">([0-9.]+) ms</text>', text)
    assert len(scales) == 2 and scales[0] == scales[1] == heads[1][2], scales
    assert text.count('class="critical"') >= 2 and "SLOWER" in text
    saved = tmp_path / "base.json"
    saved.write_text(reports["baseline"])
    done = subprocess.run(
        cli + ["diff", str(saved), str(slow), "--html", str(page)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert "not drawn: a saved report holds no spans" in text
    assert len(re.findall(r'text-anchor="end">', text)) == 1


def test_each_side_can_be_a_job_in_a_backend(server):  # noqa: F811 (the imported fixture)
    """``--jaeger URL``: a side that is no file is a job id the backend holds (searched by its
    job id tag), analysed as a trace folder would be; a job it does not hold is exit 2, named."""
    from test_analysis_backends import Backend

    base = DataParallel(ranks=4, steps=12, input_ms=2.0, seed=1).job(jitter_us=50)
    slow = DataParallel(ranks=4, steps=12, input_ms=2.0, slow={1: 1.5}, seed=9).job(jitter_us=50)
    slow.job_id = "sim-slow"  # its spans' resource names another job
    by_job = {"sim-dp": base.jaeger_traces(), "sim-slow": slow.jaeger_traces()}
    searched = []

    def search(query):
        job = json.loads(query["tags"][0])["tf_otel.job.id"]
        searched.append(job)
        return {"data": by_job.get(job, [])}

    Backend.routes["/api/services"] = lambda q: {"data": ["train.py"]}
    Backend.routes["/api/traces"] = search
    cli = [sys.executable, "-m", "tf_otel.cli", "diff", "--jaeger", server]
    done = subprocess.run(
        cli + ["sim-dp", "sim-slow", "--format", "json"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(searched) == {"sim-dp", "sim-slow"}
    assert report["verdict"]["change"] == "slower"
    assert [r["candidate_rank"] for r in report["by_rank"]["ranks"] if r["moved"]] == [1]
    assert report["baseline"]["source"] == "sim-dp" and report["candidate"]["ranks"] == 4
    missing = subprocess.run(cli + ["sim-dp", "not-there"], capture_output=True, text=True)
    assert missing.returncode == 2 and "not-there" in missing.stderr, missing.stderr
