"""A Horovod custom loop (DistributedGradientTape in a tf.function) whose rank HANG_RANK stops
forever before step HANG_STEP (in Python, between steps: the other ranks then wait in that step's
allreduce), or whose rank SLOW_RANK takes SLOW_FACTOR x longer in step SLOW_STEP, or whose rank
SLOWDOWN_RANK begins each of steps SLOWDOWN_FROM..SLOWDOWN_TO-1 SLOWDOWN_S late (a persistent
slowdown, in Python between steps), or where every rank rests ALL_PAUSE_S before step
ALL_PAUSE_STEP (all between steps at once: an evaluation, a checkpoint; no stall).

Run: horovodrun -np 4 -H localhost:4 --gloo python tests/reliability/scripts/stall_train.py
Env: STEPS (default 12), STEP_SLEEP_S (default 0.2: each step's pause, before its allreduce),
HANG_RANK / HANG_STEP (default -1: nobody), HANG_FILE (the hanging rank writes time.time() there
as it stops), SLOW_RANK / SLOW_STEP (default -1), SLOW_FACTOR (default 3), SLOWDOWN_RANK
(default -1), SLOWDOWN_FROM / SLOWDOWN_TO (steps), SLOWDOWN_S (default 0.05), QUIET=1: print
only "rank R done", TRUTH_FILE (with {rank}: {"begun": each step's call, "entered": the moment
its graph began; wall clock, ns}, as JSON).
Prints "rank R step S" after each step and "rank R done" at the end.
"""

import json
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
SLOWDOWN_RANK = int(os.environ.get("SLOWDOWN_RANK", "-1"))
SLOWDOWN_FROM = int(os.environ.get("SLOWDOWN_FROM", "-1"))
SLOWDOWN_TO = int(os.environ.get("SLOWDOWN_TO", "-1"))
SLOWDOWN_S = float(os.environ.get("SLOWDOWN_S", "0.05"))
ALL_PAUSE_STEP = int(os.environ.get("ALL_PAUSE_STEP", "-1"))
ALL_PAUSE_S = float(os.environ.get("ALL_PAUSE_S", "0"))
QUIET = os.environ.get("QUIET") == "1"
TRUTH_FILE = os.environ.get("TRUTH_FILE", "")
begun = []  # wall clock, ns: each step's call of train_step (Python, before tf_otel's begin)
entered = []  # ... and the moment its graph ran its first op (after tf_otel's begin)

rng = np.random.default_rng(hvd.rank())
features = tf.constant(rng.normal(size=(32, 16)).astype("float32"))
labels = tf.constant(rng.normal(size=(32, 1)).astype("float32"))
w = tf.Variable(tf.random.stateless_normal([16, 1], seed=(1, 2)) * 0.1)
hvd.broadcast_variables([w], root_rank=0)


def pause(step):
    entered.append(time.time_ns())
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
    if step == ALL_PAUSE_STEP:
        time.sleep(ALL_PAUSE_S)
    if hvd.rank() == HANG_RANK and step == HANG_STEP:
        hang_forever(step)
    if hvd.rank() == SLOWDOWN_RANK and SLOWDOWN_FROM <= step < SLOWDOWN_TO:
        time.sleep(SLOWDOWN_S)
    begun.append(time.time_ns())
    train_step(features, labels, tf.constant(step))
    if not QUIET:
        print(f"rank {hvd.rank()} step {step}", flush=True)
if TRUTH_FILE:
    with open(TRUTH_FILE.replace("{rank}", str(hvd.rank())), "w") as out:
        json.dump({"begun": begun, "entered": entered}, out)
print(f"rank {hvd.rank()} done", flush=True)
