"""A Horovod custom loop (DistributedGradientTape in a tf.function) whose rank HANG_RANK stops
forever before step HANG_STEP (in Python, between steps: the other ranks then wait in that step's
allreduce), or whose rank SLOW_RANK takes SLOW_FACTOR x longer in step SLOW_STEP.

Run: horovodrun -np 4 -H localhost:4 --gloo python tests/reliability/scripts/stall_train.py
Env: STEPS (default 12), STEP_SLEEP_S (default 0.2: each step's pause, before its allreduce),
HANG_RANK / HANG_STEP (default -1: nobody), HANG_FILE (the hanging rank writes time.time() there
as it stops), SLOW_RANK / SLOW_STEP (default -1), SLOW_FACTOR (default 3).
Prints "rank R step S" after each step and "rank R done" at the end.
"""

import os
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

hvd.init()
STEPS = int(os.environ.get("STEPS", "12"))
STEP_SLEEP_S = float(os.environ.get("STEP_SLEEP_S", "0.2"))
HANG_RANK = int(os.environ.get("HANG_RANK", "-1"))
HANG_STEP = int(os.environ.get("HANG_STEP", "-1"))
HANG_FILE = os.environ.get("HANG_FILE", "")
SLOW_RANK = int(os.environ.get("SLOW_RANK", "-1"))
SLOW_STEP = int(os.environ.get("SLOW_STEP", "-1"))
SLOW_FACTOR = float(os.environ.get("SLOW_FACTOR", "3"))

rng = np.random.default_rng(hvd.rank())
features = tf.constant(rng.normal(size=(32, 16)).astype("float32"))
labels = tf.constant(rng.normal(size=(32, 1)).astype("float32"))
w = tf.Variable(tf.random.stateless_normal([16, 1], seed=(1, 2)) * 0.1)
hvd.broadcast_variables([w], root_rank=0)


def pause(step):
    slow = hvd.rank() == SLOW_RANK and int(step) == SLOW_STEP
    time.sleep(STEP_SLEEP_S * (SLOW_FACTOR if slow else 1.0))
    return np.float32(0)


@tf.function
def train_step(x, y, step):
    paused = tf.numpy_function(pause, [step], tf.float32, stateful=True)
    with tf.control_dependencies([paused]):  # the pause comes before the allreduce
        x = tf.identity(x)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
    tape = hvd.DistributedGradientTape(tape)
    (grad,) = tape.gradient(loss, [w])
    w.assign_sub(0.01 * grad)
    return loss


def hang_forever(step):
    if HANG_FILE:
        with open(HANG_FILE, "w") as out:
            out.write(repr(time.time()))
    print(f"rank {hvd.rank()} hangs before step {step}", flush=True)
    while True:
        time.sleep(1.0)


for step in range(STEPS):
    if hvd.rank() == HANG_RANK and step == HANG_STEP:
        hang_forever(step)
    train_step(features, labels, tf.constant(step))
    print(f"rank {hvd.rank()} step {step}", flush=True)
print(f"rank {hvd.rank()} done", flush=True)
