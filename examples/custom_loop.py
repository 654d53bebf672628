"""Custom training loop: a tf.function train step over plain tf.Variables, STEPS calls."""

import os

import numpy as np
import tensorflow as tf

STEPS = int(os.environ.get("STEPS", "20"))
rng = np.random.default_rng(0)
features = tf.constant(rng.normal(size=(128, 8)).astype("float32"))
labels = tf.constant(rng.normal(size=(128, 1)).astype("float32"))
w = tf.Variable(tf.zeros([8, 1]))
optimizer = tf.keras.optimizers.SGD(0.1)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
    optimizer.apply_gradients([(tape.gradient(loss, w), w)])
    return loss


for _ in range(STEPS):
    loss = train_step(features, labels)
print(f"done steps={STEPS} loss={float(loss):.6f}")
