"""A custom loop pulling each batch with eager ``next()`` from a tf.data iterator whose element i
takes DELAYS_MS[i % len] to produce (tf.numpy_function + time.sleep, no prefetch), then running a
tf.function step. Prints ``step S wait_ms W`` (the wait measured here) after each step."""

import os
import time

import numpy as np
import tensorflow as tf

STEPS = int(os.environ.get("STEPS", "6"))
DELAYS_MS = [float(x) for x in os.environ.get("DELAYS_MS", "30,230").split(",")]


def slow(i: np.int64) -> np.float32:
    time.sleep(DELAYS_MS[int(i) % len(DELAYS_MS)] / 1000.0)
    return np.float32(i)


dataset = tf.data.Dataset.range(STEPS).map(lambda i: tf.numpy_function(slow, [i], tf.float32))
options = tf.data.Options()
options.autotune.enabled = False
options.experimental_optimization.inject_prefetch = False  # element i is made in next(): no
dataset = dataset.with_options(options)  # background prefetch hides the delay
w = tf.Variable(1.0)


@tf.function
def train_step(x):
    w.assign_add(0.01 * x)
    return w


iterator = iter(dataset)
for step in range(STEPS):
    t0 = time.perf_counter()
    x = next(iterator)
    wait_ms = (time.perf_counter() - t0) * 1e3
    train_step(x)
    print(f"step {step} wait_ms {wait_ms:.1f}", flush=True)
print(f"done steps={STEPS}", flush=True)
