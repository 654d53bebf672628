"""``horovodrun -np 2`` with TF_OTEL_OPS_EVERY=10: Keras 3 fit and a custom tf.function loop get op
spans on steps 0, 10, 20 only, on both ranks; and on-demand op tracing through the admin
endpoint (401 without the token) and SIGUSR2 on rank 1: the same K steps on every rank.

Op spans are compared with the ops TF itself reports for one more call of the same training
function in the same process (scripts/reference_profile.py: TF's profiler, TF's XPlane proto),
never with op-type names: TF picks ``MatMul`` or oneDNN's ``_MklMatMul``, fused or not, per CPU."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import REPO, VENV_BIN, base_env, example, run
from detail_steps import job_without_detail

from tf_otel.config import HOROVOD_EVERY_DEFAULT

pytestmark = pytest.mark.integration
SLOW_LOOP = Path(__file__).resolve().parent / "scripts" / "slow_loop.py"
REFERENCE = Path(__file__).resolve().parent / "scripts" / "reference_profile.py"
OPS = ("compute", "input")


def _op_steps(spans, step_filter):
    """rank -> sorted steps whose step span (matching step_filter) has op-level children (op
    spans name their op: a step's input-wait span, on by default, is not one)."""
    steps = {s.span_id: s for s in spans if s.category == "step" and step_filter(s)}
    found = defaultdict(set)
    for span in spans:
        op = "tensorflow.op.name" in span.attributes
        if span.category in OPS and span.parent_id in steps and op:
            found[span.rank].add(steps[span.parent_id].attributes["tf_otel.step"])
    return {rank: sorted(v) for rank, v in found.items()}, steps


@pytest.mark.parametrize(
    "script, kind, every",
    [
        ("keras_fit.py", "keras_train", None),
        ("horovod_tape.py", "tf_function", None),
        # collective detail on every step: op steps still show exactly the program's ops
        ("keras_fit.py", "keras_train", "1"),
    ],
    ids=["keras3-fit", "custom-loop", "keras3-fit-detail-every-step"],
)
def test_ops_every_10_on_both_ranks(receiver, tmp_path: Path, script, kind, every):
    env = base_env(
        **receiver.env("grpc"), TF_OTEL_ENABLED="1", TF_OTEL_OPS_EVERY="10", STEPS="25",
        EVALUATE="0", REFERENCE_FILE=str(tmp_path / "reference-{rank}.json"),
    )  # fmt: skip
    if every is not None:
        env["TF_OTEL_HOROVOD_EVERY"] = every
    else:  # the default details 1 step in 20 by trace id: a detail step runs the detail twin,
        # whose timing ops the reference call (step 25, not detailed) does not run; keep the
        # op steps (and the reference) off the detail steps, as most jobs' steps are
        key = "keras_train" if kind == "keras_train" else "tf_function:train_step"
        env["TF_OTEL_JOB_ID"] = job_without_detail(key, [10, 20, 25], HOROVOD_EVERY_DEFAULT)
    command = [
        str(VENV_BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
        str(VENV_BIN / "python"), str(REFERENCE), example(script),
    ]  # fmt: skip
    result = run(command, env)
    assert result.stdout.count("done steps=25") == 2, result.stdout[-2000:]
    reported = {}  # rank -> {(op name, op type)} TF's profiler saw in one training-function call
    for rank in (0, 1):
        ops = json.loads((tmp_path / f"reference-{rank}.json").read_text())["ops"]
        reported[rank] = {tuple(op) for op in ops}
        assert len(reported[rank]) >= 20, reported[rank]  # forward, backward and update ops

    def is_train(s):
        return s.attributes.get("tf_otel.step.kind") == kind

    spans = receiver.wait_for(lambda s: len([x for x in s if is_train(x)]) >= 52, 30)
    spans = receiver.wait_for(lambda s: False, 2)
    found, steps = _op_steps(spans, is_train)
    assert sorted((s.rank, s.attributes["tf_otel.step"]) for s in steps.values()) == sorted(
        (r, i)
        for r in (0, 1)
        for i in range(26)  # step 25: the reference call (not op-traced)
    )
    assert found == {0: [0, 10, 20], 1: [0, 10, 20]}
    traced = defaultdict(set)  # (rank, step) -> {(op name, op type)} of its op spans
    for span in spans:
        kind_of_op = span.attributes.get("tensorflow.op.type")
        if span.category in OPS and span.parent_id in steps and kind_of_op:
            step = steps[span.parent_id].attributes["tf_otel.step"]
            traced[(span.rank, step)].add((span.attributes["tensorflow.op.name"], kind_of_op))
    for (rank, step), ops in sorted(traced.items()):
        if step == 0:  # the first call also runs one-off ops (shape / range set-up)
            assert reported[rank] <= ops, (rank, sorted(reported[rank] - ops))
        else:  # every op TF runs in a call, named and typed as TF reports it, and no other
            assert ops == reported[rank], (rank, step, sorted(ops ^ reported[rank]))


def _post(port, token=None, steps=3):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/ops?steps={steps}", method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _wait_line(proc, pattern, lines, timeout=120):
    deadline = time.monotonic() + timeout
    regex = re.compile(pattern)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = regex.search(line)
        if m:
            return m
    raise AssertionError(f"no {pattern!r} in output:\n{''.join(lines[-40:])}")


def _admin_port(proc, lines):
    """The port rank 0's admin endpoint took (TF_OTEL_ADMIN_PORT=0), from its log line."""
    pattern = r"tf_otel: admin endpoint on http://127\.0\.0\.1:(\d+)"
    found = next(filter(None, (re.search(pattern, line) for line in lines)), None)
    return int((found or _wait_line(proc, pattern, lines)).group(1))


def test_on_demand_admin_endpoint_and_signal(receiver):
    env = base_env(  # admin port 0: rank 0 binds any free one and logs which
        **receiver.env("grpc"), TF_OTEL_ENABLED="1", TF_OTEL_ADMIN_PORT="0",
        TF_OTEL_ADMIN_TOKEN="s3cret", TF_OTEL_OPS_SIGNAL_STEPS="2", STEPS="70", PAUSE_MS="60",
    )  # fmt: skip
    command = [
        str(VENV_BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
        str(VENV_BIN / "python"), str(SLOW_LOOP),
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    try:
        pid1 = int(_wait_line(proc, r"rank 1 pid (\d+)", lines).group(1))
        _wait_line(proc, r"rank 0 step 5\b", lines)
        port = _admin_port(proc, lines)
        assert _post(port)[0] == 401
        assert _post(port, token="wrong")[0] == 401
        status, body = _post(port, token="s3cret", steps=3)
        assert status == 200, body
        assert body["steps"] == 3
        start = body["start"]["tf_function:train_step"]
        assert start > 5
        _wait_line(proc, rf"rank 1 step {start + 8}\b", lines)
        os.kill(pid1, signal.SIGUSR2)  # rank 1 asks rank 0, which broadcasts the window
        out, _ = proc.communicate(timeout=180)
        lines.append(out)
    finally:
        proc.kill()
        proc.wait()
    text = "".join(lines)
    assert text.count("done steps=70") == 2, text[-3000:]

    def is_train(s):
        return "train_step" in s.name

    spans = receiver.wait_for(lambda s: len([x for x in s if is_train(x)]) >= 140, 30)
    spans = receiver.wait_for(lambda s: False, 2)
    found, _ = _op_steps(spans, is_train)
    assert found[0] == found[1], found  # the same steps on every rank
    traced = found[0]
    assert traced[:3] == [start, start + 1, start + 2]  # the endpoint's window
    later = traced[3:]  # the signal's window: 2 consecutive steps after the endpoint's
    assert len(later) == 2 and later[1] == later[0] + 1 and later[0] > start + 8, traced
