"""Ground truth for the time between steps (a stalling Keras callback, named) and the I/O per
step (files of known size read once through tf.data), with controls that must find nothing."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import base_env, python, run  # noqa: E402

from wholestep.analysis_of import analyze_received  # noqa: E402

pytestmark = pytest.mark.integration

JOB = str(Path(__file__).resolve().parent / "input_job.py")


def _steps(spans, kind="keras_train"):
    steps = [
        s for s in spans if s.category == "step" and s.attributes.get("tf_otel.step.kind") == kind
    ]
    return sorted(steps, key=lambda s: s.attributes["tf_otel.step"])


def _run(receiver, tmp_path, count, **extra):
    env = base_env(**receiver.env("grpc"), TF_OTEL_ENABLED="1", DATA_DIR=str(tmp_path), **extra)
    result = run([python(), JOB], env)
    spans = receiver.wait_for(lambda s: len(_steps(s)) >= count, 30)
    return result, _steps(spans)


@pytest.mark.parametrize("sleep_ms", [100, 0], ids=["stall", "control"])
def test_callback_stall_is_time_between_steps_and_named(receiver, tmp_path, sleep_ms):
    _, steps = _run(
        receiver, tmp_path, 30, MODE="keras", STEPS="30", CALLBACK_SLEEP_MS=str(sleep_ms)
    )
    # the callback sleeps after batches 9, 19, 29: the gap before steps 10 and 20
    for step in steps[1:]:
        number = step.attributes["tf_otel.step"]
        between = step.attributes["tf_otel.between_steps_ns"] / 1e6
        callback = step.attributes["tf_otel.between_steps.callback_ns"] / 1e6
        top = list(step.attributes.get("tf_otel.between_steps.top", ()))
        if sleep_ms and number % 10 == 0:
            assert between >= sleep_ms and callback >= sleep_ms, (number, between, top)
            assert top and top[0].startswith("Stall="), top
        else:
            assert callback < 50, (number, callback, top)
            assert not any(t.startswith("Stall=") for t in top), top
    # process CPU time per step: never more than every core for the whole wall time; a 100 ms
    # sleep between steps is not CPU time
    cpus = len(os.sched_getaffinity(0))
    for step in steps[1:]:
        cpu = step.attributes["tf_otel.process.cpu_time_ns"]
        wall = step.end_ns - step.start_ns + step.attributes["tf_otel.between_steps_ns"]
        assert step.attributes["tf_otel.process.cpus"] == cpus
        assert 0 <= cpu <= 1.1 * cpus * wall + 2e6, (cpu, wall)
        if sleep_ms and step.attributes["tf_otel.step"] % 10 == 0:
            assert cpu < 0.5 * wall, (cpu, wall)
    # the tf.data pipeline's batch(4), found under its map and prefetch
    assert {s.attributes.get("tf_otel.batch.size") for s in steps} == {4}
    # the analysis, from the run's spans alone: the time between steps, with the callback named
    result = analyze_received(receiver.spans())
    found = {f.rule: f for f in result.findings}
    if sleep_ms:
        assert "time_between_steps" in found, [f.summary for f in result.findings]
        evidence = found["time_between_steps"].evidence
        stall = next(n for n in evidence["named"] if n["name"] == "Stall")
        # after batches 9 and 19 (29's sleep follows the last step)
        assert stall["steps"] == 2 and stall["ms"] >= 2 * sleep_ms, evidence
        assert evidence["callbacks_ms"] >= 2 * sleep_ms, evidence
        assert "Stall" in found["time_between_steps"].summary
        assert "cpu_bound" not in found  # the process sleeps 100 ms of each 10 steps
    else:
        assert "time_between_steps" not in found, found["time_between_steps"].evidence


def test_read_bytes_add_up_to_the_files(receiver, tmp_path):
    # 4 files x 256 records x 32 KiB read once (no repeat): 32 MiB through TFRecordDataset in
    # 128 steps; what the prefetch reads before step 0 begins (~2 batches) is no step's
    result, steps = _run(
        receiver,
        tmp_path,
        1,
        MODE="readonce",
        FILES="4",
        RECORDS="256",
        RECORD_BYTES="32768",
        BATCH="8",
    )
    file_bytes = int(result.stdout.split("file_bytes=")[1].split()[0])
    spans = receiver.wait_for(lambda s: len(_steps(s)) >= 128, 30)
    steps = _steps(spans)
    assert len(steps) in (128, 129)  # the call that meets the end of the data is a step too
    read = sum(s.attributes.get("tf_otel.io.read_bytes", 0) for s in steps)
    assert read == pytest.approx(file_bytes, rel=0.05), (read, file_bytes)
    assert all(s.attributes["process.memory.usage"] > 10 * 2**20 for s in steps)
    assert sum(s.attributes.get("tf_otel.io.read_ops", 0) for s in steps) > 0
