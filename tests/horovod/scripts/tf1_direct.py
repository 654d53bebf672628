"""TF1 graph mode with the program's own per-gradient ``hvd.allreduce`` (what
tensorflow/benchmarks' tf_cnn_benchmarks does with --variable_update=horovod; OPTIMIZER=1:
Horovod's DistributedOptimizer in a MonitoredTrainingSession with hooks instead, as Horovod's
tensorflow_mnist.py), Session.run per step, and an evaluation run after each
training run that fetches only the loss (its graph needs no collective).

Prints "rank N done loss=..." (the program's own fetch results, which tf_otel must hand back)
and ``TF1 {json}``: tf_otel's counters and the threads that built runs ahead. STEP_SLEEP_S
between steps (a step that takes time, so the runs' preparation ends inside the job).
"""

import json
import os
import threading
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()
hvd.init()
STEPS = int(os.environ.get("STEPS", "8"))
STEP_SLEEP_S = float(os.environ.get("STEP_SLEEP_S", "0"))
rng = np.random.default_rng(hvd.rank())
features = rng.normal(size=(64, 16)).astype("float32")
labels = rng.normal(size=(64, 1)).astype("float32")

x = tf.compat.v1.placeholder(tf.float32, [None, 16])
y = tf.compat.v1.placeholder(tf.float32, [None, 1])
w1 = tf.compat.v1.get_variable("w1", [16, 16])
w2 = tf.compat.v1.get_variable("w2", [16, 1])
loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2) - y))
variables = [w1, w2]
MONITORED = os.environ.get("OPTIMIZER") == "1"
if MONITORED:  # Horovod's DistributedOptimizer (its tf.cond each) in a MonitoredTrainingSession
    global_step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.01))
    train_op = optimizer.minimize(loss, global_step=global_step)
else:
    grads = tf.gradients(loss, variables)
    reduced = [hvd.allreduce(g, name=f"grad_{i}") for i, g in enumerate(grads)]
    train_op = tf.group([v.assign_sub(0.01 * g) for v, g in zip(variables, reduced)])
feed = {x: features, y: labels}


class Broadcast(tf.compat.v1.train.SessionRunHook):
    """What hvd.BroadcastGlobalVariablesHook does (this Horovod build leaves it out)."""

    def begin(self):
        self.op = hvd.broadcast_global_variables(0)

    def after_create_session(self, session, coord):
        session.run(self.op)


if MONITORED:  # tensorflow_mnist's way: hooks add their own fetches to the runs
    hooks = [
        Broadcast(),
        tf.compat.v1.train.StopAtStepHook(last_step=10 * STEPS),
        tf.compat.v1.train.LoggingTensorHook({"w2": tf.reduce_sum(w2)}, every_n_iter=4),
    ]
    session = tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks)
else:
    session = tf.compat.v1.Session()
with session as sess:
    if not MONITORED:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(hvd.broadcast_global_variables(0))
    for _ in range(STEPS):
        value, _ = sess.run([loss, train_op], feed)
        evaluated = sess.run(loss, feed)
        assert isinstance(evaluated, np.floating), type(evaluated)
        time.sleep(STEP_SLEEP_S)
from tf_otel import health  # noqa: E402
from tf_otel.instrument import detail_twin  # noqa: E402

report = {
    "rank": hvd.rank(),
    "main": threading.current_thread().name,
    "prepared_on": detail_twin.prepared_on(),
    "generations": detail_twin.generations(),
    "counters": {
        k: v for k, v in health.counters.items() if k.startswith(("twin", "horovod_graph", "error"))
    },
}
print("TF1 " + json.dumps(report), flush=True)
print(f"rank {hvd.rank()} done loss={float(value):.6f}", flush=True)
