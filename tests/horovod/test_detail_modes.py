"""Collective-detail modes (issue 13) and exact per-rank arrivals with Horovod's response cache
on (issue 17 point 3), real horovodrun, real OTLP receiver; functional, no timing goals.

- default source (every rank times its own collectives), detail on 1 sampled step in N picked by
  the step trace id: collectives on exactly those steps, on every rank, none elsewhere;
- dense detail (1 in 3): one span per collective, no wait / transfer children by default;
  TF_OTEL_HOROVOD_PARTS=1 (the 3-rank test): the waiting ranks' collectives get them;
- TF_OTEL_HOROVOD=0: step spans, no collectives; TF_OTEL_HOROVOD_SOURCE=timeline: collectives
  from Horovod's timeline on the same detail steps;
- 3 ranks, cache on, a straggler delayed before one step (ground truth) and a control step: every
  rank's arrival is known, the delayed rank is named last by every rank and the others wait.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import VENV_BIN, base_env, run  # noqa: E402
from detail_steps import STEP_PREPARE, detailed_steps, job_with_detail  # noqa: E402

from tf_otel.instrument.horovod.collective_source import detail_wanted  # noqa: E402

pytestmark = pytest.mark.integration
SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "stamps_loop.py")
KEY = "tf_function:train_step"


def horovodrun(env, np: int = 2):
    command = [str(VENV_BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", "--gloo"]
    return run(command + [str(VENV_BIN / "python"), SCRIPT], env, timeout=400)


def spans_of(receiver, wait_s: float = 4.0):
    return receiver.wait_for(lambda s: False, wait_s)


def training_steps(spans):
    return [s for s in spans if s.category == "step" and "train_step" in s.name]


@pytest.mark.parametrize("mode", ["stamps", "timeline", "off"])
def test_collectives_only_on_the_detail_steps_of_every_rank(receiver, tmp_path, mode):
    every = 3
    env = base_env(
        **receiver.env("grpc"),
        TF_OTEL_ENABLED="1",
        STEPS="12",
        TMPDIR=str(tmp_path),
        TF_OTEL_HOROVOD_EVERY=str(every),
        # a job id whose policy picks some of the 12 steps, not none (odds (2/3)**12 at random)
        TF_OTEL_JOB_ID=job_with_detail(KEY, range(12), every, "modes"),
        **STEP_PREPARE,  # every picked step detailed (background: tests/horovod/test_twin_ready)
    )
    if mode == "timeline":
        env["TF_OTEL_HOROVOD_SOURCE"] = "timeline"
    if mode == "off":
        env["TF_OTEL_HOROVOD"] = "0"
    result = horovodrun(env)
    assert "rank 1 done" in result.stdout
    spans = spans_of(receiver)
    steps = training_steps(spans)
    assert {(s.attributes["tf_otel.step"], s.rank) for s in steps} == {
        (n, r) for n in range(12) for r in (0, 1)
    }, "step spans on every rank for every step"
    by_id = {s.span_id: s for s in spans}
    got = defaultdict(set)  # step -> ranks with collectives
    for c in (s for s in spans if s.category == "collective"):
        parent = by_id[c.parent_id]
        assert parent.rank == c.rank and parent.start_ns <= c.start_ns <= c.end_ns <= parent.end_ns
        # dense detail (1 in 3): a span may hold a group of tensors that completed together
        tensors = c.attributes.get("horovod.fused_tensors", 1)
        assert c.attributes["horovod.bytes"] == tensors * 32 * 32 * 4
        assert c.attributes["horovod.op"] == "allreduce"
        got[parent.attributes["tf_otel.step"]].add(c.rank)
    if mode == "off":
        assert not got
        return
    wanted = {
        s.attributes["tf_otel.step"] for s in steps if detail_wanted(int(s.trace_id, 16), every)
    }
    assert wanted and len(wanted) < 12, "the policy picks some steps, not all (trace ids)"
    if mode == "timeline":  # a step's collectives can start before Horovod opens its file
        assert got and set(got) <= wanted
    else:
        assert set(got) == detailed_steps(wanted)
    assert all(ranks == {0, 1} for ranks in got.values())
    if mode == "stamps":  # detail 1 step in 3 (< 10): one span per collective, the wait on it
        assert not [s for s in spans if s.category in ("collective.wait", "collective.transfer")]
        collectives = [s for s in spans if s.category == "collective"]
        assert all(isinstance(c.attributes["horovod.wait_ns"], int) for c in collectives)
        assert any(c.attributes["horovod.last_arrival"] for c in collectives)


def test_every_rank_knows_its_arrival_with_the_cache_on_3_ranks(receiver, tmp_path):
    slow_step, slow_rank = 6, 2
    env = base_env(
        **receiver.env("grpc"),
        TF_OTEL_ENABLED="1",
        STEPS="10",
        TMPDIR=str(tmp_path),
        TF_OTEL_HOROVOD_EVERY="1",
        TF_OTEL_HOROVOD_PARTS="1",  # wait / transfer children even on every-step detail
        SLOW_RANK=str(slow_rank),
        SLOW_MS="80",
        SLOW_STEPS=str(slow_step),
    )
    assert "HOROVOD_CACHE_CAPACITY" not in env  # Horovod's default: response cache on
    result = horovodrun(env, np=3)
    assert "rank 2 done" in result.stdout
    spans = spans_of(receiver)
    by_id = {s.span_id: s for s in spans}
    collectives = [s for s in spans if s.category == "collective"]
    per_step = defaultdict(list)
    for c in collectives:
        per_step[by_id[c.parent_id].attributes["tf_otel.step"]].append(c)
    assert set(per_step) == set(range(10))
    for step, items in per_step.items():
        assert {c.rank for c in items} == {0, 1, 2}
        assert all(c.attributes["horovod.arrival"] == "stamp" for c in items), step
        keys = defaultdict(list)
        for c in items:
            keys[c.attributes["tf_otel.collective.key"]].append(c)
        for same in keys.values():  # one collective: one rank is last, seen by all
            assert len(same) == 3 and sum(c.attributes["horovod.last_arrival"] for c in same) == 1
    slow = per_step[slow_step]
    assert all(c.attributes["horovod.last_arrival"] == (c.rank == slow_rank) for c in slow)
    waits = [c.attributes["horovod.wait_ns"] for c in slow if c.rank != slow_rank]
    assert min(waits) >= 60e6, waits  # the injected 80 ms, less what the others were behind
    children = [s for s in spans if s.category == "collective.wait"]
    assert {by_id[w.parent_id].rank for w in children if w.parent_id in by_id} >= {0, 1}
    # control: no step without an injected delay makes anyone wait as long
    others = [
        c.attributes["horovod.wait_ns"]
        for step, items in per_step.items()
        if step not in (0, slow_step)
        for c in items
    ]
    assert max(others) < min(waits), (max(others), min(waits))


@pytest.mark.parametrize("fused", ["", "0"], ids=["fused_default", "per_tensor"])
def test_dense_detail_one_span_per_group_that_completed_together(receiver, tmp_path, fused):
    """Detail on every step (dense): by default one collective span per group of tensors that
    came back together on rank 0 (Horovod's fused responses), the same groups on every rank,
    every tensor of the step in exactly one span; TF_OTEL_HOROVOD_FUSED=0: one span a tensor."""
    layers, steps_n = 6, 8
    env = base_env(
        **receiver.env("grpc"),
        TF_OTEL_ENABLED="1",
        STEPS=str(steps_n),
        LAYERS=str(layers),
        TMPDIR=str(tmp_path),
        TF_OTEL_HOROVOD_EVERY="1",
    )
    if fused:
        env["TF_OTEL_HOROVOD_FUSED"] = fused
    result = horovodrun(env)
    assert "rank 1 done" in result.stdout
    spans = spans_of(receiver)
    by_id = {s.span_id: s for s in spans}
    per_rank_step = defaultdict(list)
    for c in (s for s in spans if s.category == "collective"):
        per_rank_step[(by_id[c.parent_id].attributes["tf_otel.step"], c.rank)].append(c)
    assert {step for step, _ in per_rank_step} == set(range(steps_n))
    shapes = {}
    for (step, rank), items in per_rank_step.items():
        covered = sum(c.attributes.get("horovod.fused_tensors", 1) for c in items)
        assert covered == layers, (step, rank, covered)  # every tensor once
        assert sum(c.attributes["horovod.bytes"] for c in items) == layers * 32 * 32 * 4
        shape = sorted(
            (c.attributes["tf_otel.collective.key"], c.attributes.get("horovod.fused_tensors", 1))
            for c in items
        )
        shapes.setdefault(step, []).append(shape)
    for step, both in shapes.items():
        assert len(both) == 2 and both[0] == both[1], (step, both)  # rank 0's groups on both
    fused_spans = [
        c
        for items in per_rank_step.values()
        for c in items
        if "horovod.fused_tensors" in c.attributes
    ]
    if fused == "0":
        assert not fused_spans
    else:
        # a 6-tensor tape's gradients are ready within a cycle: Horovod fuses them
        assert fused_spans, "no group in 8 steps"
