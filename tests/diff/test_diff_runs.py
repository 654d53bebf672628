"""``tf-otel diff`` on real runs (horovodrun, gloo, 2 ranks, tests/diff/diff_train.py): against
a baseline, (a) an input map slowed by 20 ms a batch, (b) hidden layers twice as wide, (c) rank
1 training on a batch 1.5x larger every step, (d) the same program again (the control). Each
change is named with its category / rank and its size within 20 % of what the runs stamp
themselves (their own input waits and own work, timed in-process); the control is no change
and names nothing, its threshold stated and no wider than the runs' step-to-step spread. Live:
the runs after the baseline get TF_OTEL_BASELINE=<its report>, and rank 0 marks the slower
input run's windows on their step roots, none of the control's.

    .venv/bin/pytest -q -m quiet_host tests/diff/test_diff_runs.py   # on a quiet host
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Dict, Tuple

import pytest
from conftest import REPO, VENV_BIN, base_env, horovodrun, run

# separate runs compared: another process on the host moves one run's steps, not the other's
# (on a host at load 7-9 on 2 cores two runs of the same program differed by 2x); deselected
# by default (pyproject addopts), run on a quiet host with -m quiet_host
pytestmark = [pytest.mark.integration, pytest.mark.quiet_host]

SCRIPT = REPO / "tests" / "diff" / "diff_train.py"
STEPS = 50
WARM = 5  # steps left out of the truth (tracing, first allocations)
RUNS = {
    "baseline": {},
    "control": {},
    "input": {"INPUT_DELAY_MS": "20"},
    "wider": {"WIDTH": "1024"},
    "rank1": {"SLOW_RANK": "1", "SLOW_FACTOR": "1.5"},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Dict[str, Tuple[Path, Dict[str, Dict[int, float]]]]:
    root = tmp_path_factory.mktemp("diff-runs")
    out = {}
    for name, extra in RUNS.items():  # one after the other: each run has the host to itself
        folder = root / name
        folder.mkdir()
        env = base_env(
            TF_OTEL_ENABLED="1",
            TF_OTEL_FILE=str(folder / "spans-{rank}.jsonl"),
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
            TF_OTEL_STEP_FUNCTIONS="train_step",
            TF_OTEL_HOROVOD_EVERY="1",  # collectives on every step: own work told from waits
            STEPS=str(STEPS),
            BATCH="512",  # ~20 ms of own work a step: changes well above a shared host's noise
            TRUTH_FILE=str(root / f"{name}-truth-{{rank}}.json"),
            **extra,
        )
        if name != "baseline":  # rank 0 compares each window with the baseline, live
            env["TF_OTEL_BASELINE"] = str(root / "baseline.json")
        horovodrun(str(SCRIPT), env, timeout=300)
        if name == "baseline":
            report = run(
                [str(VENV_BIN / "tf-otel"), "analyze", str(folder), "--format", "json"],
                base_env(),
                timeout=180,
            )
            (root / "baseline.json").write_text(report.stdout)
        truth = {}
        for rank in (0, 1):
            stamped = json.loads((root / f"{name}-truth-{rank}.json").read_text())
            truth[rank] = {
                key: statistics.fmean(
                    v / 1e6 for step, v in stamped[key].items() if int(step) >= WARM
                )
                for key in ("input_ns", "work_ns")
            }
        out[name] = (folder, truth)
    return out


def _diff(runs, candidate: str) -> dict:
    done = run(
        [
            str(VENV_BIN / "tf-otel"),
            "diff",
            str(runs["baseline"][0]),
            str(runs[candidate][0]),
            "--format",
            "json",
        ],
        base_env(),
        timeout=180,
    )
    return json.loads(done.stdout)


def _moved(report: dict) -> Dict[str, float]:
    return {r["category"]: r["delta_ms"] for r in report["by_category"] if r.get("moved")}


def _truth_delta(runs, candidate: str, key: str, rank: int) -> float:
    return runs[candidate][1][rank][key] - runs["baseline"][1][rank][key]


def test_the_control_is_no_change(runs):
    report = _diff(runs, "control")
    verdict = report["verdict"]
    context = json.dumps(report, indent=1)[:3000]
    assert verdict["change"] == "no change", context
    assert not report["moved"], context
    assert not [r for r in report["by_rank"]["ranks"] if r["moved"]], context
    spread = max(verdict["baseline_sigma_ms"], verdict["candidate_sigma_ms"])
    assert 0 < verdict["threshold_ms"] <= spread, context


def test_a_slower_input_map_is_input(runs):
    report = _diff(runs, "input")
    truth = statistics.fmean(_truth_delta(runs, "input", "input_ns", r) for r in (0, 1))
    moved = _moved(report)
    context = (truth, json.dumps(report, indent=1)[:3000])
    assert report["verdict"]["change"] == "slower", context
    assert "input" in moved and max(moved, key=lambda c: abs(moved[c])) == "input", context
    assert moved["input"] == pytest.approx(truth, rel=0.2), context


def test_wider_layers_are_compute_on_both_ranks(runs):
    report = _diff(runs, "wider")
    truth = statistics.fmean(_truth_delta(runs, "wider", "work_ns", r) for r in (0, 1))
    moved = _moved(report)
    context = (truth, json.dumps(report, indent=1)[:3000])
    assert max(moved, key=lambda c: abs(moved[c])) == "compute", context
    assert moved["compute"] == pytest.approx(truth, rel=0.2), context
    ranks = {r["candidate_rank"]: r for r in report["by_rank"]["ranks"]}
    assert all(ranks[r]["moved"] for r in (0, 1)), context


def test_one_ranks_heavier_compute_names_that_rank(runs):
    report = _diff(runs, "rank1")
    truth = _truth_delta(runs, "rank1", "work_ns", 1)
    ranks = {r["candidate_rank"]: r for r in report["by_rank"]["ranks"]}
    context = (truth, json.dumps(report, indent=1)[:3000])
    assert ranks[1]["moved"] and not ranks[0]["moved"], context
    assert ranks[1]["work_delta_ms"] == pytest.approx(truth, rel=0.2), context
    assert "rank 1's own work" in " ".join(report["moved"]), context


def _baseline_events(folder: Path) -> list:
    """The live comparison's events on the step roots in a run's span files."""
    found = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            for resource in json.loads(line).get("resourceSpans", []) if line.strip() else []:
                for scope in resource.get("scopeSpans", []):
                    for span in scope.get("spans", []):
                        for event in span.get("events", []):
                            if event.get("name") == "tf_otel.baseline.slower":
                                found.append((span["name"], event))
    return found


def test_live_against_the_baseline_marks_the_slower_run_only(runs):
    """TF_OTEL_BASELINE=<the baseline's report>: rank 0 marks the slower input run's windows on
    their step roots, and none of the control's."""
    assert _baseline_events(runs["control"][0]) == []
    slower = _baseline_events(runs["input"][0])
    assert slower, "no window of the run with a 20 ms slower input was marked"
    for _, event in slower:
        attributes = {a["key"]: a["value"] for a in event["attributes"]}
        ratio = attributes["tf_otel.baseline.ratio"].get("doubleValue")
        assert ratio is not None and ratio > 1.1, attributes
