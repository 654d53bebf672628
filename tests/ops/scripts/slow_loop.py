"""A Horovod custom loop with a pause between steps, for on-demand op tracing tests: prints
``rank R pid P`` once and ``rank R step S`` after each step (so a test knows where the job is)."""

import os
import time

import horovod.tensorflow as hvd
import tensorflow as tf

hvd.init()
STEPS = int(os.environ.get("STEPS", "60"))
PAUSE_S = float(os.environ.get("PAUSE_MS", "50")) / 1000.0
w = tf.Variable(tf.random.stateless_normal([16, 16], seed=(1, 2)), name="w")
x = tf.random.stateless_normal([32, 16], seed=(3, hvd.rank()))


@tf.function
def train_step(x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
    grad = hvd.allreduce(tape.gradient(loss, w))
    w.assign_sub(0.01 * grad)
    return loss


print(f"rank {hvd.rank()} pid {os.getpid()}", flush=True)
for step in range(STEPS):
    train_step(x)
    print(f"rank {hvd.rank()} step {step}", flush=True)
    time.sleep(PAUSE_S)
print(f"rank {hvd.rank()} done steps={STEPS}", flush=True)
