"""Horovod collectives in TF1 graphs (``Session.run``) timed by the default source (issue 23
point 1: right by default on TF1 programs such as tf_cnn_benchmarks), real horovodrun -np 2,
real OTLP receiver:

- the program's own per-gradient ``hvd.allreduce`` (tf_cnn_benchmarks' way) and Horovod's
  DistributedOptimizer (each collective inside Horovod's ``tf.cond``): every collective on both
  ranks in every detail step, with the rank's own arrival (``horovod.arrival=stamp``);
- only detail steps fetch the stamps, and only the stamps of collectives the run itself needs:
  an evaluation run that fetches the loss gets no collective; the program's fetch results are
  handed back unchanged (the scripts check their types);
- no step builds the run with its stamps (issue 45): every run is built ahead on the twin thread
  (``tf_otel-twin``), never run there; a picked step before that is done on both ranks runs
  without stamps on both and says so (``preparing``); from the first detailed step on, every
  picked training step is detailed on both ranks.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import base_env, horovodrun  # noqa: E402

from tf_otel import record  # noqa: E402
from tf_otel.instrument.horovod.collective_source import detail_wanted  # noqa: E402

pytestmark = pytest.mark.integration
DIRECT = str(Path(__file__).resolve().parent / "scripts" / "tf1_direct.py")


def reports(stdout: str):
    lines = [line for line in stdout.splitlines() if "TF1 {" in line]
    found = [json.loads(line.split("TF1 ", 1)[1]) for line in lines]
    assert sorted(r["rank"] for r in found) == [0, 1], stdout[-3000:]
    return found


@pytest.mark.parametrize(
    "optimizer,tensors",
    [("0", {"grad_0", "grad_1"}), ("1", None)],
    ids=["direct_allreduce", "distributed_optimizer"],
)
def test_tf1_collectives_timed_on_detail_steps(receiver, tmp_path, optimizer, tensors):
    every, steps_n = 2, 30
    env = base_env(
        **receiver.env("grpc"),
        TF_OTEL_ENABLED="1",
        STEPS=str(steps_n),
        STEP_SLEEP_S="0.1",
        OPTIMIZER=optimizer,
        TMPDIR=str(tmp_path),
        TF_OTEL_HOROVOD_EVERY=str(every),
        TF_OTEL_HOROVOD_FUSED="0",  # one span a tensor, to check each
        # fixed: the picked steps are the same on every run (at random none is picked 1 in 256)
        TF_OTEL_JOB_ID="graph-stamps",
    )
    result = horovodrun(DIRECT, env)
    assert "rank 0 done" in result.stdout and "rank 1 done" in result.stdout, result.stdout
    for report in reports(result.stdout):
        counters = report["counters"]
        assert counters.get("horovod_graph_stamps_prepared", 0) >= 1, report
        assert not counters.get("horovod_graph_stamps_built_on_step"), report
        assert not counters.get("horovod_graph_stamps_prepare_ran"), report
        assert not counters.get("twin_open_late"), report
        assert report["prepared_on"] and set(report["prepared_on"]) == {"tf_otel-twin"}, report
        queued, prepared, opened = report["generations"]
        assert queued >= 2 and prepared == queued and opened == queued, report
    spans = receiver.wait_for(lambda s: False, 4.0)
    steps = [s for s in spans if s.category == "step"]
    by_id = {s.span_id: s for s in spans}
    # training runs fetch [loss, train_op]; the evaluation runs fetch the loss alone
    training = [s for s in steps if "," in s.attributes["tensorflow.session.fetches"]]
    assert {s.rank for s in training} == {0, 1}
    detail = {
        (s.attributes["tf_otel.step"], s.attributes["tensorflow.session.fetches"])
        for s in steps
        if detail_wanted(int(s.trace_id, 16), every)
    }
    deferred = defaultdict(set)  # (step, fetches) -> ranks whose span says "preparing"
    for s in steps:
        if s.attributes.get(record.ATTR_DETAIL_TWIN) == record.DETAIL_TWIN_PREPARING:
            key = (s.attributes["tf_otel.step"], s.attributes["tensorflow.session.fetches"])
            deferred[key].add(s.rank)
    assert set(deferred) <= detail, "only picked steps are deferred"
    timed = defaultdict(set)  # (step, fetches, rank) -> tensors
    for c in (s for s in spans if s.category == "collective"):
        parent = by_id[c.parent_id]
        assert parent.rank == c.rank and parent.start_ns <= c.start_ns <= c.end_ns <= parent.end_ns
        assert c.attributes["horovod.arrival"] == "stamp", c.attributes
        assert c.attributes["horovod.bytes"] > 0
        key = (parent.attributes["tf_otel.step"], parent.attributes["tensorflow.session.fetches"])
        timed[key + (c.rank,)].add(c.attributes["horovod.tensor"].rsplit("/", 1)[-1])
    # (the broadcast_global_variables run is a step with a collective of its own)
    assert {(k[0], k[1]) for k in timed} <= detail, "collectives on detail runs only"
    train_fetches = {s.attributes["tensorflow.session.fetches"] for s in training}
    detail_training = sorted(d for d in detail if d[1] in train_fetches)
    detailed = []
    for step, fetches in detail_training:
        ranks = {r for r in (0, 1) if timed.get((step, fetches, r))}
        waited = deferred.get((step, fetches), set())
        assert ranks in (set(), {0, 1}) and waited in (set(), {0, 1}), (step, ranks, waited)
        assert bool(ranks) != bool(waited), (step, "deferred xor detailed", ranks, waited)
        for rank in ranks:
            got = timed[(step, fetches, rank)]
            assert tensors is None or got >= tensors, got
        if ranks:
            detailed.append(step)
    assert detailed, ("no picked training step was detailed", detail_training, dict(deferred))
    assert all(step in detailed for step, _ in detail_training if step > detailed[0]), (
        "every picked training step after the first detailed one is detailed"
    )
    evaluation = {s.attributes["tensorflow.session.fetches"] for s in steps} - train_fetches
    assert not {k for k in timed if k[1] in evaluation and "," not in k[1] and "Mean" == k[1]}, (
        "an evaluation run fetching the loss ran no collective"
    )
    assert any(d[1] == "Mean" for d in detail), "an evaluation run drew detail"
