"""TF1 graph-mode training loop: one Session.run per step.

MONITORED=1: a MonitoredTrainingSession stopped by a StopAtStepHook; MONITORED=fixed: a fixed
loop of STEPS runs in a MonitoredTrainingSession. CHECKPOINT_DIR (monitored only) adds its
checkpoint and summary hooks (restore at creation, a save at close). EVAL=1: one evaluation run
(the loss alone) after training.
"""

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

MONITORED = os.environ.get("MONITORED", "0")
EVAL = os.environ.get("EVAL") == "1"
if MONITORED in ("1", "fixed"):
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=STEPS)] if MONITORED == "1" else []
    with tf.compat.v1.train.MonitoredTrainingSession(
        checkpoint_dir=os.environ.get("CHECKPOINT_DIR") or None, hooks=hooks
    ) as sess:
        if MONITORED == "1":
            while not sess.should_stop():
                value, _ = sess.run([loss, train_op], {x: features, y: labels})
        else:
            for _ in range(STEPS):
                value, _ = sess.run([loss, train_op], {x: features, y: labels})
        if EVAL:
            value = sess.run(loss, {x: features, y: labels})
else:
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(STEPS):
            value, _ = sess.run([loss, train_op], {x: features, y: labels})
        if EVAL:
            value = sess.run(loss, {x: features, y: labels})
print(f"done steps={STEPS} loss={value:.6f}")
