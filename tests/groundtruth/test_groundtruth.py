"""Ground truth: 4 Horovod ranks, one slowed in known steps; `tf-otel analyze --format json` must
name exactly those steps, that rank and the right cause, with the delay within 10 %; the
control run (nothing injected) must name nothing.

One horovodrun per scenario (module-scoped), written as OTLP-JSON files (TF_OTEL_FILE per rank)
and analysed by the real CLI. The launch is the ``launch`` fixture: today 4 ranks on this host
(``horovodrun -np 4 -H localhost:4 --gloo``); the simulated cluster (tests/cluster/sim.py, two
hosts x two ranks) replaces it there, and the slow-link scenario (d) waits for it.

Scenarios (tests/groundtruth/train_groundtruth.py):
  late    - rank 2 sleeps DELAY_MS before it begins steps 5 and 12    -> cause before_step
  input   - rank 2's tf.data generator sleeps DELAY_MS in those steps -> cause input
  compute - rank 2 trains those steps on a 256x larger batch          -> cause compute;
            the delay's truth is measured in-process by every rank (its own work before the
            gradient allreduce). Expected to fail until Horovod's per-rank arrivals are exact
            with the response cache on (issue 17 point 3): today ranks other than 0 carry
            horovod.arrival=unknown, nothing a rank records shows compute inside its step
            function, and the analysis rightly blames nobody (straggler_wait + a warning)
  none    - nothing injected: no step straggler, no straggler finding
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Callable, Dict

import pytest
from conftest import REPO, VENV_BIN, base_env, run

pytestmark = pytest.mark.integration

SCRIPT = REPO / "tests" / "groundtruth" / "train_groundtruth.py"
RANKS = 4
SLOW_RANK = 2
SLOW_STEPS = [5, 12]
DELAY_MS = 300.0
STEPS = 20  # steps are cheap next to the launch; the run's noise is learned from them
CAUSE = {"late": "before_step", "input": "input", "compute": "compute"}


@pytest.fixture(scope="module")
def launch() -> Callable[[Dict[str, str]], None]:
    """Runs the training script on RANKS ranks with this environment (the cluster goes here)."""

    def start(env: Dict[str, str]) -> None:
        command = [
            str(VENV_BIN / "horovodrun"),
            "-np",
            str(RANKS),
            "-H",
            f"localhost:{RANKS}",
            "--gloo",
            str(VENV_BIN / "python"),
            str(SCRIPT),
        ]
        run(command, env, timeout=420)

    return start


EXACT_ARRIVALS = pytest.mark.xfail(
    reason="needs exact per-rank Horovod arrivals with the response cache on (issue 17 point 3)",
    strict=False,
)


@pytest.fixture(
    scope="module",
    params=["late", "input", pytest.param("compute", marks=EXACT_ARRIVALS), "none"],
)
def scenario(request, launch, tmp_path_factory):
    name = request.param
    out = tmp_path_factory.mktemp(f"groundtruth-{name}")
    (out / "spans").mkdir()
    (out / "truth").mkdir()
    env = base_env(
        TF_OTEL_ENABLED="1",
        TF_OTEL_FILE=str(out / "spans" / "spans-{rank}.jsonl"),
        TF_OTEL_STEP_FUNCTIONS="train_step",
        OTEL_TRACES_EXPORTER="none",
        SCENARIO=name,
        SLOW_RANK=str(SLOW_RANK),
        SLOW_STEPS=",".join(map(str, SLOW_STEPS)),
        DELAY_MS=str(DELAY_MS),
        STEPS=str(STEPS),
        TRUTH_FILE=str(out / "truth" / "truth-{rank}.json"),
    )
    launch(env)
    analysed = run(
        [str(VENV_BIN / "tf-otel"), "analyze", str(out / "spans"), "--format", "json"], base_env()
    )
    return name, json.loads(analysed.stdout), _truth(out / "truth")


def _truth(folder: Path) -> Dict[int, Dict[int, float]]:
    """step -> rank -> the rank's own work before its gradient allreduce (ms), in-process."""
    by_step: Dict[int, Dict[int, float]] = {}
    for path in folder.glob("truth-*.json"):
        data = json.loads(path.read_text())
        for step, ns in data["work_ns"].items():
            by_step.setdefault(int(step), {})[data["rank"]] = ns / 1e6
    return by_step


def _extra_work(truth: Dict[int, Dict[int, float]], step: int, rank: int) -> float:
    work = truth[step]
    return work[rank] - statistics.median(v for r, v in work.items() if r != rank)


def test_analysis_names_exactly_the_injected_stragglers(scenario):
    name, report, truth = scenario
    steps = {s["step"]: s for s in report["steps"]}
    assert len(steps) == STEPS, sorted(steps)
    assert 0 in report["summary"]["warmup_steps"]  # tracing the step function
    named = {n: s["straggler"] for n, s in steps.items() if s["straggler"]}
    context = json.dumps(
        {
            "named": named,
            "noise": report["summary"]["lateness_noise"],
            "threshold_ms": report["summary"]["straggler_threshold_ms"],
            "truth_ms": {n: truth[n] for n in sorted(truth)},
        }
    )
    for step in steps.values():
        assert 0 <= step["what_if_ms"] <= step["duration_ms"], context
    if name == "none":
        assert named == {}, context
        assert not [f for f in report["findings"] if f["rule"] == "straggler"], context
        return
    assert sorted(named) == SLOW_STEPS, context
    for number, straggler in named.items():
        assert straggler["rank"] == SLOW_RANK, context
        assert straggler["category"] == CAUSE[name], context
        # the delay as the ranks measured it in-process (a loaded host oversleeps a sleep)
        expected = _extra_work(truth, number, SLOW_RANK)
        if name != "compute":
            assert expected >= 0.95 * DELAY_MS, context  # the injection happened
        assert abs(straggler["delay_ms"] - expected) <= 0.1 * expected, (expected, context)
        assert straggler["excess_ms"] <= steps[number]["duration_ms"]
    finding = next(f for f in report["findings"] if f["rule"] == "straggler")
    assert finding["evidence"]["rank"] == SLOW_RANK and finding["evidence"]["steps"] == SLOW_STEPS
