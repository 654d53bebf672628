"""A real TF1 parameter-server cluster (1 ps + 2 workers on 127.0.0.1, TF_CONFIG, MonitoredTraining
Session, replica_device_setter) with TF_OTEL_OPS_EVERY=5: op-traced steps hold both workers' op
spans and RecvTensor transfer spans whose byte counts are the ps variables' sizes.

The op spans are compared with what TF itself reports for the same training run in the same
process (the script's own FULL_TRACE RunMetadata on steps 1 and 6, which tf_otel does not trace):
the kernels TF picks differ per CPU (``MatMul`` or oneDNN's ``_MklMatMul``), so no op type is
named here."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import List

import pytest
from conftest import REPO, base_env, free_port_pair, free_ports, python
from ports import Tasks, with_new_ports

pytestmark = pytest.mark.integration

W1_BYTES, W2_BYTES = 32 * 64 * 4, 64 * 1 * 4  # examples/ps_tf1.py's variables (float32)
SCRIPT = Path(__file__).resolve().parent / "scripts" / "ps_tf1_reference.py"
REFERENCE_STEPS = (1, 6)  # the script's own FULL_TRACE runs: never op-traced by tf_otel (every 5)


def test_ps_cluster_op_traced_steps_hold_ops_and_recv_transfers(receiver, tmp_path: Path):
    def start() -> List[str]:  # the workers' outputs; again with new ports if one was taken
        receiver.clear()  # nothing from a start that met a taken port
        ps, w0, w1 = free_ports(3)
        coord = free_port_pair()
        cluster = {"ps": [f"127.0.0.1:{ps}"], "worker": [f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"]}
        with Tasks([ps, w0, w1, coord, coord + 1]) as tasks:  # the ps is killed on leaving
            for task, index in (("ps", 0), ("worker", 0), ("worker", 1)):
                env = base_env(
                    **receiver.env("grpc"),
                    TF_CONFIG=json.dumps(
                        {"cluster": cluster, "task": {"type": task, "index": index}}
                    ),
                    TF_OTEL_ENABLED="1",
                    TF_OTEL_OPS_EVERY="5",
                    TF_OTEL_ROOT_WAIT_MS="500",  # the ps task runs no steps: roots do not wait
                    TF_OTEL_COORDINATOR=f"127.0.0.1:{coord}",
                    STEPS="11",
                    REFERENCE_STEPS=",".join(map(str, REFERENCE_STEPS)),
                    REFERENCE_FILE=str(tmp_path / "reference-{rank}.jsonl"),
                )
                tasks.start([python(), str(SCRIPT)], env, cwd=REPO)
            return tasks.wait([1, 2], timeout=240)

    outputs = with_new_ports(start)
    for index, out in enumerate(outputs):
        assert f"worker {index} done steps=11" in out, out[-3000:]
    reported = {}  # rank -> {(node, type, device)} TF reported for the training run
    for rank in (0, 1):
        lines = (tmp_path / f"reference-{rank}.jsonl").read_text().splitlines()
        runs = [{tuple(op) for op in json.loads(line)["ops"]} for line in lines]
        assert len(runs) == len(REFERENCE_STEPS) and runs[0] == runs[1], rank  # fixed per run
        assert len(runs[0]) >= 20, runs[0]  # a real training run: forward, backward, update
        reported[rank] = runs[0]

    def train_steps(spans):
        return [
            s
            for s in spans
            if s.category == "step" and "GradientDescent" in s.attributes.get(
                "tensorflow.session.fetches", "")
        ]  # fmt: skip

    # the workers have exited, their exit flush done: what they sent is here (a step's op spans
    # are made with its step span), so no fixed wait for late ones
    spans = receiver.wait_for(lambda s: len(train_steps(s)) >= 22, 30)
    steps = {s.span_id: s for s in train_steps(spans)}
    assert sorted((s.rank, s.attributes["tf_otel.step"]) for s in steps.values()) == sorted(
        (rank, step) for rank in (0, 1) for step in range(11)
    )
    ops = defaultdict(list)  # (rank, step) -> op-level spans of the training run
    for span in spans:
        if span.category in ("compute", "transfer") and span.parent_id in steps:
            parent = steps[span.parent_id]
            assert parent.start_ns <= span.start_ns <= span.end_ns <= parent.end_ns
            ops[(span.rank, span.attributes["tf_otel.step"])].append(span)
    assert sorted(ops) == [(rank, step) for rank in (0, 1) for step in (0, 5, 10)]
    for (rank, step), members in ops.items():
        computes = [s for s in members if s.category == "compute"]
        spans = [
            tuple(s.attributes[k] for k in ("tensorflow.op.name", "tensorflow.op.type",
                                            "tensorflow.device"))
            for s in computes
        ]  # fmt: skip
        assert len(spans) == len(set(spans))  # one span per op execution
        assert set(spans) == reported[rank], (  # every op TF ran, named and typed as TF does
            rank, step, sorted(set(spans) ^ reported[rank])
        )  # fmt: skip
        devices = {s.attributes["tensorflow.device"] for s in computes}
        assert any(f"/job:worker/replica:0/task:{rank}" in d for d in devices), devices
        transfers = [s for s in members if s.category == "transfer"]
        me = f"/job:worker/replica:0/task:{rank}/"
        pulled = {  # variables read from the ps by this worker
            s.attributes["tensorflow.transfer.bytes"]
            for s in transfers
            if s.attributes["tensorflow.transfer.src"].startswith("/job:ps/")
            and s.attributes["tensorflow.transfer.dst"].startswith(me)
        }
        assert {W1_BYTES, W2_BYTES} <= pulled, (rank, step, pulled)
        for t in transfers:  # pulls and gradient pushes: always between the ps and this worker
            ends = {
                t.attributes["tensorflow.transfer.src"],
                t.attributes["tensorflow.transfer.dst"],
            }
            assert any(e.startswith("/job:ps/") for e in ends), ends
            assert any(e.startswith(me) for e in ends), ends
    # one trace per step: both workers' op-traced steps share the step trace
    for step in (0, 5, 10):
        traces = {s.trace_id for s in steps.values() if s.attributes["tf_otel.step"] == step}
        assert len(traces) == 1
