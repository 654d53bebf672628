"""A DistributedGradientTape loop for the collective-detail tests (any number of ranks).

SLOW_RANK sleeps SLOW_MS in Python before the steps in SLOW_STEPS (a straggler whose gradients
are late); LAYERS dense gradients; STEPS steps; Horovod's response cache stays on (default).
DEBUG_LOG=1: tf_otel's debug lines on stderr, each with its rank (a test's failure message).
"""

import logging
import os
import time

import horovod.tensorflow as hvd
import tensorflow as tf

hvd.init()
if os.environ.get("DEBUG_LOG") == "1":
    logging.basicConfig(format=f"[rank {hvd.rank()} %(relativeCreated)d ms] %(message)s")
    logging.getLogger("tf_otel").setLevel(logging.DEBUG)
STEPS = int(os.environ.get("STEPS", "10"))
LAYERS = int(os.environ.get("LAYERS", "3"))
SLOW_RANK = int(os.environ.get("SLOW_RANK", "-1"))
SLOW_MS = float(os.environ.get("SLOW_MS", "0"))
SLOW_STEPS = {int(s) for s in os.environ.get("SLOW_STEPS", "").split(",") if s.strip()}

x = tf.random.stateless_normal([16, 32], seed=(hvd.rank(), 1))
variables = [
    tf.Variable(tf.random.stateless_normal([32, 32], seed=(i, 2)) * 0.1, name=f"w{i}")
    for i in range(LAYERS)
]


@tf.function
def train_step():
    with tf.GradientTape() as tape:
        h = x
        for v in variables:
            h = tf.nn.relu(tf.matmul(h, v))
        loss = tf.reduce_mean(h)
    grads = hvd.DistributedGradientTape(tape).gradient(loss, variables)
    for v, g in zip(variables, grads):
        v.assign_sub(0.01 * g)
    return loss


for step in range(STEPS):
    if hvd.rank() == SLOW_RANK and step in SLOW_STEPS:
        time.sleep(SLOW_MS / 1000.0)
    loss = train_step()
print(f"rank {hvd.rank()} done steps={STEPS} loss={float(loss):.6f}", flush=True)
