"""Per-op memory on op-traced TF1 steps (sources/step_stats.op_memory), for real: a Session.run
step computing a known-size output (1,000,000 bytes) and a small one (16 bytes); the op spans of
the traced steps carry exactly those output sizes and an allocation peak at least as large; the
steps that are not op-traced carry no op spans at all. Sizes only, never values."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import base_env, python, run  # noqa: E402

pytestmark = pytest.mark.integration

JOB = str(Path(__file__).resolve().parent / "tf1_memory_job.py")
STEPS = 4


def test_op_spans_carry_their_output_bytes(receiver):
    env = base_env(
        **receiver.env("grpc"), TF_OTEL_ENABLED="1", TF_OTEL_OPS_EVERY="2", STEPS=str(STEPS)
    )
    result = run([python(), JOB], env, timeout=300)
    assert f"done steps={STEPS}" in result.stdout, result.stderr[-2000:]
    spans = receiver.wait_for(lambda s: sum(x.category == "step" for x in s) >= STEPS, 30)
    spans = receiver.wait_for(lambda s: False, 2)
    by_name: dict = {}
    for span in spans:
        name = span.attributes.get("tensorflow.op.name")
        if name in ("big", "small"):
            by_name.setdefault(name, []).append(span)
    # steps 0 and 2 are op-traced (TF_OTEL_OPS_EVERY=2), 1 and 3 are not; their step spans say so
    marks = {
        s.attributes["tf_otel.step"]: list(s.attributes.get("tf_otel.detail") or ())
        for s in spans
        if s.category == "step"
    }
    assert marks == {0: ["ops"], 1: [], 2: ["ops"], 3: []}, marks
    for name, size in (("big", 1_000_000), ("small", 16)):
        traced = sorted(s.attributes["tf_otel.step"] for s in by_name.get(name, ()))
        assert traced == [0, 2], (name, traced)
        for span in by_name[name]:
            assert span.attributes["tensorflow.op.output_bytes"] == size, span.attributes
            assert span.attributes.get("tensorflow.op.memory.peak_bytes", size) >= size
    assert any("tensorflow.op.memory.peak_bytes" in s.attributes for s in by_name["big"])
