"""A custom loop whose batches are in-memory tensors (no tf.data), over REPLICAS logical CPU
devices of a MirroredStrategy (REPLICAS=1: no strategy at all). DATASET=1: the same batches
from a tf.data dataset (the control). Prints "done".

Env: STEPS (default 6), REPLICAS (default 2), DATASET (0 | 1).
"""

import os

import numpy as np
import tensorflow as tf

REPLICAS = int(os.environ.get("REPLICAS", "2"))
STEPS = int(os.environ.get("STEPS", "6"))
DATASET = os.environ.get("DATASET", "0") == "1"

if REPLICAS > 1:
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(REPLICAS)]
    )
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
else:
    strategy = tf.distribute.get_strategy()

with strategy.scope():
    weights = tf.Variable(tf.zeros([32, 4]))
    optimizer = tf.keras.optimizers.SGD(0.01)


@tf.function
def train_step(x, y):
    def replica(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, weights) - y))
        grads = tape.gradient(loss, [weights])
        optimizer.apply_gradients(zip(grads, [weights]))
        return loss

    losses = strategy.run(replica, args=(x, y))
    return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)


rng = np.random.default_rng(0)
x = tf.constant(rng.normal(size=(16 * REPLICAS, 32)), tf.float32)
y = tf.constant(rng.normal(size=(16 * REPLICAS, 4)), tf.float32)
if DATASET:
    batches = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
    for _ in range(STEPS):
        train_step(*next(batches))
else:
    for _ in range(STEPS):
        train_step(x, y)
print("done", flush=True)
