"""Rank faults under a real ``horovodrun --gloo`` with the real OTLP receiver: a rank SIGKILLed
mid-step, rank 0 killed, the coordinator's port taken by another process, and a stranger with
the wrong secret knocking on rank 0's coordinator and clock service while the job runs.

Each test prints one ``FIGURES`` line (wall time, spans exported / lost) for
docs/guides/RELIABILITY.md.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Dict, List, Tuple

import pytest
from conftest import REPO, VENV_BIN, base_env, free_port_pair

from .channel_peers import clock_login, coordinator_login

pytestmark = pytest.mark.integration

SCRIPT = str(REPO / "tests" / "reliability" / "scripts" / "rank_fault_train.py")
STEPS = 8
KILL_STEP = 5


def _launch(
    np_: int, env: Dict[str, str], timeout: float = 300
) -> Tuple[subprocess.CompletedProcess, float]:
    command = [
        str(VENV_BIN / "horovodrun"),
        "-np",
        str(np_),
        "-H",
        f"localhost:{np_}",
        "--gloo",
        str(VENV_BIN / "python"),
        SCRIPT,
    ]
    t0 = time.monotonic()
    result = subprocess.run(
        command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    return result, time.monotonic() - t0


def _env(receiver, **extra: str) -> Dict[str, str]:
    settings = {"TF_OTEL_ENABLED": "1", "TF_OTEL_ROOT_WAIT_MS": "1000", "STEPS": str(STEPS)}
    return base_env(**receiver.env("grpc"), **{**settings, **extra})


def _steps(spans) -> Dict[int, List[int]]:
    """rank -> the steps of its train_step spans that reached the receiver."""
    out: Dict[int, List[int]] = {}
    for s in spans:
        if s.category == "step" and "train_step" in s.name:
            out.setdefault(s.attributes["tf_otel.rank"], []).append(s.attributes["tf_otel.step"])
    return {rank: sorted(steps) for rank, steps in out.items()}


def _roots(spans) -> Dict[int, object]:
    return {
        s.attributes["tf_otel.step"]: s
        for s in spans
        if s.category == "step.root" and "train_step" in s.name
    }


def _no_tf_otel_failure(output: str) -> None:
    """tf_otel never raised: no thread traceback, no fail-open report, no coordinator crash."""
    assert "Exception in thread" not in output, output[-3000:]
    assert "tracing of this part is skipped" not in output, output[-3000:]
    assert "coordinator connection ended" not in output, output[-3000:]


def _figures(name: str, **values: object) -> None:
    print(f"FIGURES {name} " + " ".join(f"{k}={v}" for k, v in values.items()), file=sys.stderr)


def test_rank_sigkilled_mid_step_others_exported_and_root_partial(receiver) -> None:
    env = _env(receiver, KILL_RANK="2", KILL_STEP=str(KILL_STEP), TF_OTEL_ROOT_WAIT_MS="3000")
    result, wall = _launch(3, env)
    output = result.stdout + result.stderr
    assert f"rank 2 killing itself in step {KILL_STEP}" in output
    assert result.returncode != 0, "horovodrun reports the dead rank"
    spans = receiver.wait_for(lambda s: False, 3)
    steps = _steps(spans)
    for rank in (0, 1):  # both survivors finished the kill step (its allreduce was done)
        assert set(range(KILL_STEP + 1)) <= set(steps.get(rank, [])), steps
    roots = _roots(spans)
    root = roots[KILL_STEP]
    assert root.attributes["tf_otel.step.partial"] is True
    assert list(root.attributes["tf_otel.step.ranks_reported"]) == [0, 1]
    assert root.attributes["tf_otel.step.ranks"] == 2
    # control: a step whose span the killed rank did export before it died has a whole root (what
    # it had not exported yet — early steps wait for its clock to settle, a loaded machine makes
    # that seconds — dies with it; step 0 also waits for every rank's coordinator link)
    exported_before = [s for s in steps.get(2, []) if 0 < s < KILL_STEP]
    assert exported_before, f"the killed rank exported none of steps 1..{KILL_STEP - 1}: {steps}"
    for step in exported_before:
        assert "tf_otel.step.partial" not in roots[step].attributes, step
    _no_tf_otel_failure(output)
    expected = 3 * KILL_STEP + 2  # steps before the kill on 3 ranks, the kill step on 2
    got = sum(1 for r in steps for s in steps[r] if s <= KILL_STEP)
    _figures(
        "rank_sigkill",
        wall_s=round(wall, 1),
        step_spans=got,
        step_spans_expected=expected,
        rank2_spans=len(steps.get(2, [])),
        partial_roots=sum(1 for r in roots.values() if r.attributes.get("tf_otel.step.partial")),
    )


def _kill_rank0(receiver, enabled: str) -> Tuple[subprocess.CompletedProcess, float, list]:
    env = _env(receiver, KILL_RANK="0", KILL_STEP=str(KILL_STEP), TF_OTEL_ENABLED=enabled)
    result, wall = _launch(2, env, timeout=240)
    spans = receiver.wait_for(lambda s: False, 3) if enabled == "1" else []
    return result, wall, spans


def test_rank0_killed_others_neither_hang_nor_fail_because_of_tf_otel(receiver) -> None:
    traced, traced_wall, spans = _kill_rank0(receiver, "1")
    untraced, untraced_wall, _ = _kill_rank0(receiver, "0")
    for result in (traced, untraced):
        output = result.stdout + result.stderr
        assert f"rank 0 killing itself in step {KILL_STEP}" in output
        assert "rank 1 done" not in output, "Horovod ends rank 1 (not tf_otel)"
    _no_tf_otel_failure(traced.stdout + traced.stderr)
    # tf_otel adds no wait of its own to rank 1's end (30 s: a hung coordinator link would show)
    assert traced_wall < untraced_wall + 30, (traced_wall, untraced_wall)
    steps = _steps(spans)
    assert set(range(KILL_STEP)) <= set(steps.get(1, [])), steps
    _figures(
        "rank0_kill",
        traced_wall_s=round(traced_wall, 1),
        untraced_wall_s=round(untraced_wall, 1),
        rank1_step_spans=len(steps.get(1, [])),
        rank0_step_spans=len(steps.get(0, [])),
    )


def test_coordinator_port_taken_training_goes_on_and_spans_exported(receiver) -> None:
    port = free_port_pair()
    squatter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, time\n"
            f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(16)\n"
            "print('listening', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert squatter.stdout.readline().strip() == "listening"
        env = _env(receiver, TF_OTEL_COORDINATOR=f"127.0.0.1:{port}")
        result, wall = _launch(2, env)
    finally:
        squatter.kill()
        squatter.wait()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "rank 0 done" in output and "rank 1 done" in output
    assert output.count(f"cannot listen on 127.0.0.1:{port}") == 1, output[-3000:]
    _no_tf_otel_failure(output)
    spans = receiver.wait_for(lambda s: False, 3)
    steps = _steps(spans)
    assert steps.get(0) == list(range(STEPS)) and steps.get(1) == list(range(STEPS)), steps
    roots = _roots(spans)
    _figures(
        "port_taken",
        wall_s=round(wall, 1),
        step_spans=sum(len(v) for v in steps.values()),
        step_spans_expected=2 * STEPS,
        roots=len(roots),
    )


def test_wrong_secret_is_refused_while_the_real_ranks_work(receiver) -> None:
    port = free_port_pair()
    attempts = {"coordinator": 0, "clock": 0, "welcomed": 0}
    stop = threading.Event()

    def stranger() -> None:
        wrong = b"\x00" * 32
        while not stop.wait(0.2):
            for service in ("coordinator", "clock"):
                try:
                    if service == "coordinator":
                        sock, ok = coordinator_login(("127.0.0.1", port), 1, wrong)
                    else:
                        sock, ok = clock_login("127.0.0.1", port + 1, 1, wrong)
                    sock.close()
                except (OSError, ValueError):
                    continue  # not listening (yet / any more)
                attempts[service] += 1
                attempts["welcomed"] += ok

    thread = threading.Thread(target=stranger, daemon=True)
    thread.start()
    try:
        env = _env(receiver, TF_OTEL_COORDINATOR=f"127.0.0.1:{port}", TF_OTEL_ROOT_WAIT_MS="5000")
        result, wall = _launch(2, env)
    finally:
        stop.set()
        thread.join(10)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert attempts["coordinator"] > 0 and attempts["clock"] > 0, attempts
    assert attempts["welcomed"] == 0, attempts
    assert "coordinator refused a connection" in output
    assert "clock service refused a connection" in output
    _no_tf_otel_failure(output)
    spans = receiver.wait_for(lambda s: False, 3)
    roots = _roots(spans)
    assert sorted(roots) == list(range(STEPS))
    for root in roots.values():  # the real ranks were never refused: every root covers both
        assert root.attributes["tf_otel.step.ranks"] == 2
        assert "tf_otel.step.partial" not in root.attributes
    _figures("wrong_secret", wall_s=round(wall, 1), **attempts)
