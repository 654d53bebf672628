"""`TF_OTEL_ENABLED=1 horovodrun -np 2`: one trace per sampled step holding both ranks' spans
under one root; unsampled steps produce nothing on any rank. Real horovodrun, gloo and MPI."""

from __future__ import annotations

from collections import defaultdict

import pytest
from conftest import base_env, horovodrun
from sampling import ratio_sampled_steps

pytestmark = pytest.mark.integration


def _traces(spans):
    by_trace = defaultdict(list)
    for span in spans:
        if span.category in ("step", "step.root"):
            by_trace[span.trace_id].append(span)
    return by_trace


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_every_sampled_step_is_one_trace_across_both_ranks(receiver, backend):
    env = base_env(
        **receiver.env("grpc"),
        TF_OTEL_ENABLED="1",
        STEPS="16",
        OTEL_TRACES_SAMPLER="parentbased_traceidratio",
        OTEL_TRACES_SAMPLER_ARG="0.5",
    )
    result = horovodrun("horovod_tape.py", env, backend=backend)
    assert "rank 0 done steps=16" in result.stdout and "rank 1 done steps=16" in result.stdout
    spans = receiver.wait_for(lambda s: False, 3)  # let both ranks' last batches arrive
    train = [s for s in spans if s.category == "step" and "train_step" in s.name]
    sampled = sorted({s.attributes["tf_otel.step"] for s in train})
    # exactly the steps whose trace the SDK's ratio sampler keeps; the others have no spans
    assert set(sampled) == ratio_sampled_steps(spans, train, range(16), 0.5)
    by_trace = _traces(spans)
    for trace_id, members in by_trace.items():
        roots = [s for s in members if s.category == "step.root"]
        steps = [s for s in members if s.category == "step"]
        if not any("train_step" in s.name for s in steps):
            continue
        assert len(roots) == 1, f"trace {trace_id}: {len(roots)} roots"
        root = roots[0]
        assert sorted(s.attributes["tf_otel.rank"] for s in steps) == [0, 1]
        assert len({s.attributes["tf_otel.step"] for s in steps}) == 1
        assert root.attributes["tf_otel.step.ranks"] == 2
        for step in steps:
            assert step.parent_id == root.span_id
            assert root.start_ns <= step.start_ns <= step.end_ns <= root.end_ns
    # unsampled steps: no span from either rank
    for rank in (0, 1):
        mine = {s.attributes["tf_otel.step"] for s in train if s.attributes["tf_otel.rank"] == rank}
        assert mine == set(sampled)
    resources = {s.resource["tf_otel.rank"]: s.resource for s in train}
    assert resources[0]["tf_otel.job.id"] == resources[1]["tf_otel.job.id"]
    assert resources[1]["tf_otel.world_size"] == 2
    assert resources[0]["tf_otel.launcher"] == ("horovod" if backend == "gloo" else "openmpi")
