"""Horovod collectives in TF1 graphs (``Session.run``) timed by the default source (issue 23
point 1: right by default on TF1 programs such as tf_cnn_benchmarks), real horovodrun -np 2,
real OTLP receiver:

- the program's own per-gradient ``hvd.allreduce`` (tf_cnn_benchmarks' way) and Horovod's
  DistributedOptimizer (each collective inside Horovod's ``tf.cond``): every collective on both
  ranks in every detail step, with the rank's own arrival (``horovod.arrival=stamp``);
- only detail steps fetch the stamps, and only the stamps of collectives the run itself needs:
  an evaluation run that fetches the loss gets no collective; the program's fetch results are
  handed back unchanged (the scripts check their types).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import base_env, example, horovodrun  # noqa: E402

from tf_otel.instrument.horovod.collective_source import detail_wanted  # noqa: E402

pytestmark = pytest.mark.integration
DIRECT = str(Path(__file__).resolve().parent / "scripts" / "tf1_direct.py")


@pytest.mark.parametrize(
    "script,tensors",
    [(DIRECT, {"grad_0", "grad_1"}), (example("horovod_tf1.py"), None)],
    ids=["direct_allreduce", "distributed_optimizer"],
)
def test_tf1_collectives_timed_on_detail_steps(receiver, tmp_path, script, tensors):
    every, steps_n = 2, 8
    env = base_env(
        **receiver.env("grpc"),
        TF_OTEL_ENABLED="1",
        STEPS=str(steps_n),
        TMPDIR=str(tmp_path),
        TF_OTEL_HOROVOD_EVERY=str(every),
        TF_OTEL_HOROVOD_FUSED="0",  # one span a tensor, to check each
        # fixed: the picked steps are the same on every run (at random none is picked 1 in 256)
        TF_OTEL_JOB_ID="graph-stamps",
    )
    result = horovodrun(script, env)
    assert "rank 0 done" in result.stdout and "rank 1 done" in result.stdout, result.stdout
    spans = receiver.wait_for(lambda s: False, 4.0)
    steps = [s for s in spans if s.category == "step"]
    by_id = {s.span_id: s for s in spans}
    # training runs fetch [loss, train_op]; tf1_direct's evaluation runs fetch the loss alone
    training = [s for s in steps if "," in s.attributes["tensorflow.session.fetches"]]
    assert {s.rank for s in training} == {0, 1}
    detail = {
        (s.attributes["tf_otel.step"], s.attributes["tensorflow.session.fetches"])
        for s in steps
        if detail_wanted(int(s.trace_id, 16), every)
    }
    timed = defaultdict(set)  # (step, fetches, rank) -> tensors
    for c in (s for s in spans if s.category == "collective"):
        parent = by_id[c.parent_id]
        assert parent.rank == c.rank and parent.start_ns <= c.start_ns <= c.end_ns <= parent.end_ns
        assert c.attributes["horovod.arrival"] == "stamp", c.attributes
        assert c.attributes["horovod.bytes"] > 0
        key = (parent.attributes["tf_otel.step"], parent.attributes["tensorflow.session.fetches"])
        timed[key + (c.rank,)].add(c.attributes["horovod.tensor"].rsplit("/", 1)[-1])
    train_fetches = {s.attributes["tensorflow.session.fetches"] for s in training}
    detail_training = {d for d in detail if d[1] in train_fetches}
    assert detail_training, "no training step drew detail for this job id"
    for step, fetches in detail_training:
        for rank in (0, 1):
            got = timed.get((step, fetches, rank))
            assert got, (step, rank, "no collective")
            assert tensors is None or got >= tensors, got
    # (the broadcast_global_variables run is a step with a collective of its own)
    assert {(k[0], k[1]) for k in timed} <= detail, "collectives on detail runs only"
    evaluation = {s.attributes["tensorflow.session.fetches"] for s in steps} - train_fetches
    assert not {k for k in timed if k[1] in evaluation and "," not in k[1] and "Mean" == k[1]}, (
        "an evaluation run fetching the loss ran no collective"
    )
    if script == DIRECT:
        assert any(d[1] == "Mean" for d in detail), "an evaluation run drew detail (odds 0.5**8)"
