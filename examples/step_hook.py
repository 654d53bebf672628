"""A step hook of your own (tf_otel.hooks): each step's span gets the examples seen so far.

Run: TF_OTEL_FILE='traces/rank{rank}.jsonl' OTEL_TRACES_EXPORTER=none python examples/step_hook.py
(docs/guides/HOOKS.md; the guide shows this file)
"""

import os
from typing import Optional

import numpy as np

from tf_otel.hooks import StepCall, StepError, StepHandle, StepHook, add_step_hook
from tf_otel.instrument import TensorFlowInstrumentor

STEPS = int(os.environ.get("STEPS", "20"))


class ExamplesSeen(StepHook[int]):
    """The batch size, read at the step's start, comes back at its end as ``kept``."""

    def __init__(self) -> None:
        self.seen = 0

    def on_step_start(self, handle: StepHandle, call: StepCall) -> Optional[int]:
        batch = call.args[0] if call.args else None  # train_step(x, y): x
        shape = getattr(batch, "shape", None)
        return int(shape[0]) if shape else None  # static shape: no wait for the device

    def on_step_end(
        self, handle: StepHandle, call: StepCall, error: StepError, kept: Optional[int]
    ) -> None:
        if error is None and kept is not None:
            self.seen += kept
            handle.attributes["train.examples_seen"] = self.seen


TensorFlowInstrumentor().instrument()  # or opentelemetry-instrument python step_hook.py
add_step_hook(ExamplesSeen())

import tensorflow as tf  # noqa: E402  (before or after instrument(): either works)

rng = np.random.default_rng(0)
features = tf.constant(rng.normal(size=(128, 8)).astype("float32"))
labels = tf.constant(rng.normal(size=(128, 1)).astype("float32"))
w = tf.Variable(tf.zeros([8, 1]))


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
    w.assign_sub(0.1 * tape.gradient(loss, w))
    return loss


for _ in range(STEPS):
    loss = train_step(features, labels)
print(f"done steps={STEPS} loss={float(loss):.6f}")
