"""A Horovod custom loop whose rank KILL_RANK SIGKILLs itself inside step KILL_STEP, after that
step's allreduce (the other ranks finish the step, then wait for it in the next one).

Run: horovodrun -np 3 -H localhost:3 --gloo python tests/reliability/scripts/rank_fault_train.py
Env: STEPS (default 8), KILL_RANK / KILL_STEP (default -1: nobody), STEP_SLEEP_S (default 0.2),
KILL_GRACE_S (default 2: the killed rank's wait before SIGKILL).
Prints "rank R done" at the end and "rank R step S" after each step.
"""

import os
import signal
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

hvd.init()
STEPS = int(os.environ.get("STEPS", "8"))
KILL_RANK = int(os.environ.get("KILL_RANK", "-1"))
KILL_STEP = int(os.environ.get("KILL_STEP", "-1"))
STEP_SLEEP_S = float(os.environ.get("STEP_SLEEP_S", "0.2"))
KILL_GRACE_S = float(os.environ.get("KILL_GRACE_S", "2.0"))

rng = np.random.default_rng(hvd.rank())
features = tf.constant(rng.normal(size=(32, 16)).astype("float32"))
labels = tf.constant(rng.normal(size=(32, 1)).astype("float32"))
w = tf.Variable(tf.random.stateless_normal([16, 1], seed=(1, 2)) * 0.1)
hvd.broadcast_variables([w], root_rank=0)


def maybe_die(step):
    time.sleep(STEP_SLEEP_S)
    if hvd.rank() == KILL_RANK and int(step) == KILL_STEP:
        print(f"rank {hvd.rank()} killing itself in step {int(step)}", flush=True)
        # the steps it finished before have left the process (tf_otel exports in batches 0.5 s
        # apart): what the kill may lose is this step, not the previous ones
        time.sleep(KILL_GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)
    return np.float32(0)


@tf.function
def train_step(x, y, step):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
    tape = hvd.DistributedGradientTape(tape)
    (grad,) = tape.gradient(loss, [w])
    update = w.assign_sub(0.01 * grad)
    with tf.control_dependencies([update]):  # the allreduce is done when this runs
        return loss + tf.numpy_function(maybe_die, [step], tf.float32, stateful=True)


for step in range(STEPS):
    train_step(features, labels, tf.constant(step))
    print(f"rank {hvd.rank()} step {step}", flush=True)
print(f"rank {hvd.rank()} done", flush=True)
