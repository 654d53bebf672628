"""TF1 graph-mode training loop: one Session.run per step (MonitoredSession when MONITORED=1)."""

import os

import numpy as np
import tensorflow as tf

STEPS = int(os.environ.get("STEPS", "20"))
tf.compat.v1.disable_eager_execution()
rng = np.random.default_rng(0)
features = rng.normal(size=(256, 8)).astype("float32")
labels = features @ rng.normal(size=(8, 1)).astype("float32")

x = tf.compat.v1.placeholder(tf.float32, [None, 8])
y = tf.compat.v1.placeholder(tf.float32, [None, 1])
w = tf.compat.v1.get_variable("w", [8, 1])
loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
global_step = tf.compat.v1.train.get_or_create_global_step()
train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=global_step)

if os.environ.get("MONITORED") == "1":
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=STEPS)]
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
        while not sess.should_stop():
            value, _ = sess.run([loss, train_op], {x: features, y: labels})
else:
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(STEPS):
            value, _ = sess.run([loss, train_op], {x: features, y: labels})
print(f"done steps={STEPS} loss={value:.6f}")
