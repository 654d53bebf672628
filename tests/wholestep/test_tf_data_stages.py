"""Ground truth for the tf.data stage spans of op-traced TF2 steps (sources/tf_data.py): a real
pipeline (TFRecord reader, a sequential map sleeping SLOW_MS per element, a parallel map, batch,
prefetch) in Keras fit and in a tf.function loop. The stage spans exist with tf.data's stage
names, sit under the step's input span inside the step, and the slow map has the largest self
time (>= the injected sleep per GetNext); the control without the sleep has no stage that slow.
Assertions use tf.data stage names only, never CPU kernel names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import base_env, python, run  # noqa: E402

pytestmark = pytest.mark.integration

JOB = str(Path(__file__).resolve().parent / "stages_job.py")
SLOW_MS = 5.0
STEPS = 10
TRACED = (0, 3, 6, 9)  # TF_OTEL_OPS_EVERY=3


def _stages(receiver, tmp_path, mode, slow_ms):
    env = base_env(
        **receiver.env("grpc"), TF_OTEL_ENABLED="1", TF_OTEL_OPS_EVERY="3", DATA_DIR=str(tmp_path),
        MODE=mode, SLOW_MS=str(slow_ms), STEPS=str(STEPS),
    )  # fmt: skip
    result = run([python(), JOB], env, timeout=300)
    assert f"done steps={STEPS}" in result.stdout, result.stderr[-2000:]

    def steps_of(spans):
        return [s for s in spans if s.category == "step"]

    spans = receiver.wait_for(lambda s: len(steps_of(s)) >= STEPS, 30)
    spans = receiver.wait_for(lambda s: False, 2)  # the op-traced steps' deferred records
    by_id = {s.span_id: s for s in spans}
    stages = {}
    for span in spans:
        if not span.name.startswith("tf.data "):
            continue
        parent = by_id[span.parent_id]
        # under the step's IteratorGetNext input span (or, as framework, the step span)
        step = parent if parent.category == "step" else by_id[parent.parent_id]
        assert (parent.category, span.category) in (("input", "input"), ("step", "framework"))
        assert step.category == "step"
        assert step.start_ns <= span.start_ns <= span.end_ns <= step.end_ns
        number = step.attributes["tf_otel.step"]
        assert span.attributes["tf_otel.step"] == number
        stages.setdefault(number, []).append(span)
    assert sorted(stages) == list(TRACED), sorted(stages)
    # the op-traced steps, and only they, say tf_otel traced them (the rules leave them out)
    marked = {
        s.attributes["tf_otel.step"]: list(s.attributes.get("tf_otel.detail") or ())
        for s in steps_of(spans)
    }
    assert {n: d for n, d in marked.items() if d} == {n: ["ops"] for n in TRACED}, marked
    return stages


@pytest.mark.parametrize("mode", ["keras", "loop"])
def test_slow_map_stage_has_the_largest_self_time(receiver, tmp_path, mode):
    stages = _stages(receiver, tmp_path, mode, SLOW_MS)
    with_map = 0
    for number, spans in stages.items():
        kinds = {s.attributes["tensorflow.data.stage"] for s in spans}
        assert {"Root", "Prefetch"} <= kinds, (number, kinds)
        if number == 0:
            continue  # the first step starts the pipeline: its producer ran before the window
        top = max(spans, key=lambda s: s.attributes["tf_otel.tf_data.self_ns"])
        attributes = top.attributes
        per_call_ms = attributes["tf_otel.tf_data.self_ns"] / attributes["tf_otel.tf_data.events"]
        if "Map" not in kinds:
            # a step whose element was already prefetched can end before any slow map call
            # does: TF records only calls wholly inside the window. Nothing else may look slow.
            assert per_call_ms / 1e6 < SLOW_MS / 2, (number, top.name, per_call_ms / 1e6)
            continue
        with_map += 1
        assert "TFRecord" in kinds, (number, kinds)
        assert attributes["tensorflow.data.stage"] == "Map", (number, top.name)
        assert per_call_ms / 1e6 >= SLOW_MS * 0.95, (number, per_call_ms / 1e6)
        # the prefetch's GetNext waits for its producer: wait, not own time
        prefetch = next(s for s in spans if s.attributes["tensorflow.data.stage"] == "Prefetch")
        assert prefetch.attributes["tf_otel.tf_data.async"] is True
        assert prefetch.attributes["tf_otel.tf_data.self_ns"] == 0
        assert prefetch.attributes["tf_otel.tf_data.wait_ns"] > 0
    assert with_map >= 2, sorted(stages)  # steps 3, 6, 9: most wait on the slow map


def test_control_has_no_slow_stage(receiver, tmp_path):
    stages = _stages(receiver, tmp_path, "keras", 0)
    for number, spans in stages.items():
        if number == 0:
            continue
        for span in spans:
            attributes = span.attributes
            per_call = attributes["tf_otel.tf_data.self_ns"] / attributes["tf_otel.tf_data.events"]
            assert per_call / 1e6 < SLOW_MS / 2, (number, span.name, per_call / 1e6)
