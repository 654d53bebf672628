"""Post-mortem on a real job whose rank was SIGKILLed (issue 44, point 1): ``horovodrun -np 2
--gloo``, 0.2 s steps, rank 1 kills itself in step 40 of 60. Its span file holds its steps to
within about a second of the kill (TF_OTEL_FILE is written at least every
``TF_OTEL_FILE_FLUSH_S``, not once at exit), and ``tf-otel analyze`` on the folder exits 0 and
names the stopped rank with its last step; the same files with a record cut in half exit 0
too, the file named, the rest analysed.

Prints one ``FIGURES`` line for docs/guides/RELIABILITY.md."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest
from conftest import REPO, VENV_BIN, base_env, python, run

pytestmark = pytest.mark.integration

SCRIPT = str(REPO / "tests" / "reliability" / "scripts" / "rank_fault_train.py")
STEPS, KILL_STEP = 60, 40


def _train_steps(path: Path) -> List[int]:
    """The steps of the rank's train_step spans in its file (whole lines only)."""
    steps = []
    for line in path.read_bytes().splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        for resource in data.get("resourceSpans", []):
            for scope in resource.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    attributes = {a["key"]: a["value"] for a in span.get("attributes", [])}
                    kind = attributes.get("tf_otel.category", {}).get("stringValue")
                    if kind == "step" and "train_step" in span["name"]:
                        steps.append(int(attributes["tf_otel.step"]["intValue"]))
    return sorted(steps)


def _analyze(*args: str) -> subprocess.CompletedProcess:
    return run([python(), "-m", "tf_otel.cli", "analyze", *args], base_env(), check=False)


def test_a_sigkilled_rank_leaves_its_last_second_and_analyze_names_it(tmp_path: Path) -> None:
    folder = tmp_path / "spans"
    env = base_env(
        TF_OTEL_ENABLED="1",
        TF_OTEL_FILE=str(folder / "spans-{rank}.jsonl"),
        TF_OTEL_ROOT_WAIT_MS="2000",
        STEPS=str(STEPS),
        KILL_RANK="1",
        KILL_STEP=str(KILL_STEP),
        KILL_GRACE_S="0",
        STEP_SLEEP_S="0.2",
    )
    command = [str(VENV_BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo"]
    started = time.monotonic()
    result = subprocess.run(
        [*command, python(), SCRIPT], env=env, cwd=REPO, capture_output=True, text=True, timeout=400
    )
    wall = time.monotonic() - started
    output = result.stdout + result.stderr
    assert f"rank 1 killing itself in step {KILL_STEP}" in output, output[-3000:]
    files: Dict[int, Path] = {rank: folder / f"spans-{rank}.jsonl" for rank in (0, 1)}
    steps = {rank: _train_steps(path) for rank, path in files.items()}
    last = {rank: max(found, default=-1) for rank, found in steps.items()}
    # killed in step 40, 0.2 s steps: at most about a second lost (the export thread's half
    # second and the file's flush delay)
    assert last[1] >= KILL_STEP - 6, steps[1][-10:]
    assert last[0] >= KILL_STEP, steps[0][-10:]
    done = _analyze(str(folder), "--format", "json")
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = json.loads(done.stdout)["warnings"]
    said = f"rank 1's spans end at step {last[1]} (the others ran to {last[0]})"
    assert any(said in w for w in warnings), warnings
    assert not any("no spans from ranks [1]" in w for w in warnings), warnings
    # the same files with rank 0's last record cut in half: exit 0, the file named
    data = files[0].read_bytes()
    begin = data.rstrip(b"\n").rfind(b"\n") + 1
    files[0].write_bytes(data[: begin + (len(data) - begin) // 2])
    cut = _analyze(str(folder), "--format", "json")
    assert cut.returncode == 0, cut.stderr[-3000:]
    assert f"{files[0]}: byte {begin:,}: skipped its last record" in cut.stderr
    assert json.loads(cut.stdout)["steps"]
    strict = _analyze(str(folder), "--strict")
    assert strict.returncode == 2 and "is not valid JSON" in strict.stderr
    print(
        f"FIGURES postmortem_kill wall_s={wall:.1f} rank1_last_step={last[1]} "
        f"rank0_last_step={last[0]} kill_step={KILL_STEP} lines_rank1="
        f"{len(files[1].read_bytes().splitlines())}",
        file=sys.stderr,
    )
