"""The job's own SIGTERM handling always wins: a preemption handler that checkpoints runs, and its
exit status is the process's; tf_otel only flushes. Real TF, real OTLP receiver, real horovodrun."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest
from conftest import REPO, VENV_BIN, base_env, run

pytestmark = pytest.mark.integration
SCRIPT = REPO / "tests" / "reliability" / "scripts" / "preempt.py"


def _steps(spans):
    return [s for s in spans if s.attributes.get("tf_otel.category") == "step"]


def _sigterm_once_ready(args: List[str], env, timeout: float = 60) -> Tuple[int, str, str]:
    """Run ``python ARGS``, send SIGTERM once it printed "ready"; (status, stdout, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, out, err


@pytest.mark.parametrize("when", ["after", "before"])
def test_program_sigterm_handler_checkpoints_and_exits_zero(receiver, tmp_path: Path, when: str):
    """Untraced, this program exits 0 with its checkpoint; traced it must too (before the fix,
    tf_otel's watchdog killed it with 143 about a second after SIGTERM, before the checkpoint)."""
    env = base_env(
        # a minute's batch delay: spans can only arrive through the flushes
        **{**receiver.env("grpc"), "OTEL_BSP_SCHEDULE_DELAY": "60000"},
        TF_OTEL_ENABLED="1" if when == "after" else "0",
        HANDLER=when,
        CKPT_DIR=str(tmp_path),
    )
    status, out, err = _sigterm_once_ready([str(SCRIPT)], env)
    assert status == 0, f"status {status}\n{out}\n{err[-3000:]}"
    assert "checkpoint written" in out and "exit clean" in out
    assert list(tmp_path.glob("ckpt-rank0*.index")), "no checkpoint on disk"
    # steps made after SIGTERM (the handler let training go on) are traced and flushed at exit
    steps = _steps(receiver.wait_for(lambda s: len(_steps(s)) >= 20, 10))
    assert len({s.attributes["tf_otel.step"] for s in steps}) >= 20
    assert "Traceback" not in err


def test_default_sigterm_still_ends_the_process_after_flushing(receiver, tmp_path: Path):
    """Without a handler of the program's, SIGTERM ends the process with the default status."""
    script = tmp_path / "plain.py"
    script.write_text(
        "import time, tensorflow as tf\n"
        "v = tf.Variable(1.0)\n"
        "f = tf.function(lambda: v.assign_add(1.0))\n"
        "for i in range(10**9):\n"
        "    f()\n"
        "    if i == 5: print('ready', flush=True)\n"
        "    time.sleep(0.01)\n"
    )
    env = base_env(
        **{**receiver.env("grpc"), "OTEL_BSP_SCHEDULE_DELAY": "60000"}, TF_OTEL_ENABLED="1"
    )
    status, _, err = _sigterm_once_ready([str(script)], env)
    assert status == -signal.SIGTERM, err[-3000:]
    assert len(_steps(receiver.wait_for(lambda s: len(_steps(s)) >= 5, 10))) >= 5


def test_preemption_handler_under_horovodrun(receiver, tmp_path: Path):
    """Every rank is preempted (SIGTERM to itself at step 8, as a scheduler does): each rank's
    handler checkpoints, every rank exits 0, and horovodrun with it."""
    env = base_env(
        **receiver.env("http"),
        TF_OTEL_ENABLED="1",
        HANDLER="after",
        HVD="1",
        SELF_SIGNAL_AT="8",
        CKPT_DIR=str(tmp_path),
    )
    command = [
        str(VENV_BIN / "horovodrun"),
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
        sys.executable,
        str(SCRIPT),
    ]
    result = run(command, env, timeout=180)
    assert result.stdout.count("checkpoint written") == 2, result.stdout[-3000:]
    assert {p.name.split(".")[0] for p in tmp_path.glob("ckpt-rank*.index")} == {
        "ckpt-rank0",
        "ckpt-rank1",
    }
    steps = _steps(
        receiver.wait_for(lambda s: {x.attributes["tf_otel.rank"] for x in _steps(s)} == {0, 1}, 10)
    )
    assert {s.attributes["tf_otel.rank"] for s in steps} == {0, 1}


def test_tf_preemption_checkpoint_handler_decides(receiver, tmp_path: Path):
    """TF's PreemptionCheckpointHandler (single worker): traced, SIGTERM still ends in its
    checkpoint and its own exit status 42, as untraced."""
    env = base_env(**receiver.env("grpc"), TF_OTEL_ENABLED="1")
    script = REPO / "tests" / "reliability" / "scripts" / "tf_preemption.py"
    status, out, err = _sigterm_once_ready([str(script), str(tmp_path / "ckpt")], env, 120)
    assert status == 42, f"status {status}\n{out}\n{err[-3000:]}"
    assert list((tmp_path / "ckpt").glob("ckpt-*.index")), "no checkpoint on disk"
    assert len(_steps(receiver.wait_for(lambda s: len(_steps(s)) >= 5, 10))) >= 5
