"""Input wait of a custom loop (instrument/data.py), for real: eager ``next()`` on a tf.data
iterator whose elements take a known time (30 ms, 230 ms alternately) becomes one ``input`` span
of the step that follows it, as long as the wait, and that step's span starts with the wait."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import base_env, python, run

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).resolve().parent / "scripts" / "input_wait.py"
DELAYS_MS = (30, 230)
STEPS = 6


def test_next_waits_are_input_spans_of_the_following_step(receiver):
    env = base_env(
        **receiver.env("grpc"), TF_OTEL_ENABLED="1", STEPS=str(STEPS),
        DELAYS_MS=",".join(map(str, DELAYS_MS)),
    )  # fmt: skip
    result = run([python(), str(SCRIPT)], env, timeout=180)
    assert f"done steps={STEPS}" in result.stdout, result.stdout[-2000:]
    measured = {
        int(s): float(ms) for s, ms in re.findall(r"step (\d+) wait_ms ([\d.]+)", result.stdout)
    }

    def steps_of(spans):
        return {
            s.span_id: s
            for s in spans
            if s.category == "step" and s.attributes.get("tensorflow.function.name") == "train_step"
        }

    spans = receiver.wait_for(lambda s: len(steps_of(s)) >= STEPS, 30)
    spans = receiver.wait_for(lambda s: False, 1)
    steps = steps_of(spans)
    assert sorted(s.attributes["tf_otel.step"] for s in steps.values()) == list(range(STEPS))
    inputs = [s for s in spans if s.category == "input"]
    assert len(inputs) == STEPS, [(s.name, s.parent_id) for s in inputs]
    seen = set()
    for span in inputs:
        assert span.name == "IteratorGetNext (tf.data)"
        parent = steps[span.parent_id]  # a child of a train_step step span
        step = parent.attributes["tf_otel.step"]
        assert span.attributes["tf_otel.step"] == step
        seen.add(step)
        ms = (span.end_ns - span.start_ns) / 1e6
        # element `step` sleeps DELAYS_MS[step % 2]; the loop measured next() around our wrapper
        assert DELAYS_MS[step % 2] * 0.98 <= ms <= measured[step] + 1.0, (step, ms, measured)
        assert parent.start_ns == span.start_ns <= span.end_ns <= parent.end_ns  # get, then compute
    assert seen == set(range(STEPS))
