"""A Horovod custom loop whose runs differ in one known way, for ``tf-otel diff``'s ground truth.

Run (2 ranks on one host)::

    INPUT_DELAY_MS=20 TRUTH_FILE=/tmp/truth-{rank}.json TF_OTEL_ENABLED=1 \
    horovodrun -np 2 -H localhost:2 --gloo python tests/diff/diff_train.py

Env: STEPS (40), BATCH (256), WIDTH (512: the hidden layers' width), INPUT_DELAY_MS (0: each
batch's map sleeps this long, no prefetch, so the loop waits for it), SLOW_RANK (-1) and
SLOW_FACTOR (1.5: that rank trains on a batch this much larger, every step).

Every rank writes TRUTH_FILE ({rank} replaced): per step, how long its ``next()`` waited for
the batch (``input_ns``) and its own work from the batch in hand to its local gradients ready
(``work_ns``), measured in-process on its monotonic clock, independent of tf_otel's spans.
"""

import json
import os
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

hvd.init()
RANK = hvd.rank()
STEPS = int(os.environ.get("STEPS", "40"))
BATCH = int(os.environ.get("BATCH", "256"))
WIDTH = int(os.environ.get("WIDTH", "512"))
DELAY_S = float(os.environ.get("INPUT_DELAY_MS", "0")) / 1000.0
SLOW_RANK = int(os.environ.get("SLOW_RANK", "-1"))
SLOW_FACTOR = float(os.environ.get("SLOW_FACTOR", "1.5"))
TRUTH_FILE = os.environ.get("TRUTH_FILE", "")
rows = int(BATCH * SLOW_FACTOR) if RANK == SLOW_RANK else BATCH
features = tf.constant(np.random.default_rng(RANK).normal(size=(rows, 64)).astype("float32"))


def slow_map(x):
    if DELAY_S:
        time.sleep(DELAY_S)  # a slow map in the input pipeline: this batch takes longer
    return x


dataset = tf.data.Dataset.range(STEPS).map(
    lambda i: tf.numpy_function(slow_map, [i], tf.int64), num_parallel_calls=None
)
options = tf.data.Options()
options.autotune.enabled = False
options.experimental_optimization.inject_prefetch = False  # no overlap: the wait is the delay
dataset = dataset.with_options(options)

w1 = tf.Variable(tf.random.stateless_normal([64, WIDTH], seed=(1, 2)) * 0.1)
w2 = tf.Variable(tf.random.stateless_normal([WIDTH, WIDTH], seed=(3, 4)) * 0.05)
w3 = tf.Variable(tf.random.stateless_normal([WIDTH, 1], seed=(5, 6)) * 0.1)
variables = [w1, w2, w3]
hvd.broadcast_variables(variables, root_rank=0)
ready = []


def mark(*grads):
    ready.append(time.perf_counter_ns())  # local gradients are ready: own work ends here
    return grads


@tf.function
def train_step(x):
    with tf.GradientTape() as tape:
        hidden = tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2))
        loss = tf.reduce_mean(tf.square(tf.matmul(hidden, w3)))
    grads = tape.gradient(loss, variables)
    marked = tf.numpy_function(mark, grads, [g.dtype for g in grads], stateful=True)
    grads = [tf.ensure_shape(m, g.shape) for m, g in zip(marked, grads)]
    grads = [hvd.allreduce(g, op=hvd.Average) for g in grads]
    for var, grad in zip(variables, grads):
        var.assign_sub(0.01 * grad)
    return loss


input_ns, work_ns = {}, {}
iterator = iter(dataset)
for step in range(STEPS):
    begin = time.perf_counter_ns()
    next(iterator)
    got = time.perf_counter_ns()
    train_step(features)
    input_ns[step], work_ns[step] = got - begin, ready[-1] - got
if TRUTH_FILE:
    with open(TRUTH_FILE.replace("{rank}", str(RANK)), "w") as handle:
        json.dump({"rank": RANK, "input_ns": input_ns, "work_ns": work_ns}, handle)
print(f"rank {RANK} done steps={STEPS}", flush=True)
