"""A MirroredStrategy custom loop (``strategy.run`` in a tf.function, 2 logical CPU devices)
that notes, each time its replica function's Python runs (once per replica per trace), the
thread it runs on and whether that thread is paced (a ``sys.setprofile`` pacer). The program's
own trace comes first (the first call); the detail twin's trace on the twin thread after it.
Prints ``THREADS {json}`` once every twin queued is prepared (or after WAIT_S) and "done".
"""

import json
import os
import sys
import threading
import time

import tensorflow as tf

from tf_otel.instrument import detail_twin

cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(2)]
)
STEPS = int(os.environ.get("STEPS", "6"))
WAIT_S = float(os.environ.get("WAIT_S", "120"))
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    weights = tf.Variable(tf.ones([8, 8]))
noted = []  # (thread class, paced) each time the replica function is traced


def replica_step():
    profile = sys.getprofile()
    noted.append([type(threading.current_thread()).__name__, type(profile).__name__])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(tf.ones([4, 8]), weights))
    grad = tape.gradient(loss, weights)
    grad = tf.distribute.get_replica_context().all_reduce("sum", grad)
    weights.assign_sub(0.001 * grad)
    return loss


@tf.function
def train_step():
    return strategy.run(replica_step)


for _ in range(STEPS):
    train_step()
    time.sleep(0.05)
deadline = time.monotonic() + WAIT_S
while detail_twin.preparing() and time.monotonic() < deadline:  # queued, not prepared
    time.sleep(0.2)
report = {"noted": noted, "generations": detail_twin.generations()}
print("THREADS " + json.dumps(report), flush=True)
print("done", flush=True)
