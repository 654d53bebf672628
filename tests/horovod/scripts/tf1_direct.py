"""TF1 graph mode with the program's own per-gradient ``hvd.allreduce`` (what
tensorflow/benchmarks' tf_cnn_benchmarks does with --variable_update=horovod), Session.run per
step, and an evaluation run after each training run that fetches only the loss (its graph needs
no collective).

Prints "rank N done loss=..." (the program's own fetch results, which tf_otel must hand back).
"""

import os

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()
hvd.init()
STEPS = int(os.environ.get("STEPS", "8"))
rng = np.random.default_rng(hvd.rank())
features = rng.normal(size=(64, 16)).astype("float32")
labels = rng.normal(size=(64, 1)).astype("float32")

x = tf.compat.v1.placeholder(tf.float32, [None, 16])
y = tf.compat.v1.placeholder(tf.float32, [None, 1])
w1 = tf.compat.v1.get_variable("w1", [16, 16])
w2 = tf.compat.v1.get_variable("w2", [16, 1])
loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2) - y))
variables = [w1, w2]
grads = tf.gradients(loss, variables)
reduced = [hvd.allreduce(g, name=f"grad_{i}") for i, g in enumerate(grads)]
train_op = tf.group([v.assign_sub(0.01 * g) for v, g in zip(variables, reduced)])
feed = {x: features, y: labels}
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(hvd.broadcast_global_variables(0))
    for _ in range(STEPS):
        value, _ = sess.run([loss, train_op], feed)
        evaluated = sess.run(loss, feed)
        assert isinstance(evaluated, np.floating), type(evaluated)
print(f"rank {hvd.rank()} done loss={float(value):.6f}", flush=True)
