"""Horovod TF1 graph mode: hvd.DistributedOptimizer, Session.run per step.

Run: horovodrun -np 2 -H localhost:2 python examples/horovod_tf1.py
"""

import os

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()
hvd.init()
STEPS = int(os.environ.get("STEPS", "20"))
rng = np.random.default_rng(hvd.rank())
features = rng.normal(size=(64, 16)).astype("float32")
labels = rng.normal(size=(64, 1)).astype("float32")

x = tf.compat.v1.placeholder(tf.float32, [None, 16])
y = tf.compat.v1.placeholder(tf.float32, [None, 1])
w = tf.compat.v1.get_variable("w", [16, 1])
loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.01))
train_op = optimizer.minimize(loss)
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(hvd.broadcast_global_variables(0))
    for _ in range(STEPS):
        value, _ = sess.run([loss, train_op], {x: features, y: labels})
print(f"rank {hvd.rank()} done steps={STEPS} loss={value:.6f}")
