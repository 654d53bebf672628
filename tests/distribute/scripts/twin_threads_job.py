"""A MirroredStrategy custom loop (``strategy.run`` in a tf.function, 2 logical CPU devices)
that notes, each time its replica function's Python runs (once per replica per trace), the
thread it runs on and whether that thread is paced (a ``sys.setprofile`` pacer). The program's
own trace comes first (the first call); the detail twin's trace on the twin thread after it.
Prints ``THREADS {json}`` once every twin queued is prepared (or after WAIT_S) and "done".
With TRACE_S the replica function's Python takes that long on a paced thread (the twin's trace),
and the program exits without waiting: "exiting <monotonic s>", and from an exit handler that
runs after tf_otel's ``EXIT {json}`` (twin counters) and "exited <monotonic s>".
"""

import atexit
import json
import os
import sys
import threading
import time

import tensorflow as tf

from tf_otel import health
from tf_otel.instrument import detail_twin

cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(2)]
)
STEPS = int(os.environ.get("STEPS", "6"))
WAIT_S = float(os.environ.get("WAIT_S", "120"))
TRACE_S = float(os.environ.get("TRACE_S", "0"))


def report_exit():  # registered before the twin thread exists: runs after tf_otel's exit handler
    counters = {k: v for k, v in health.counters.items() if k.startswith("twin")}
    print("EXIT " + json.dumps(counters))
    print(f"exited {time.monotonic():.3f}", flush=True)


def tick():
    return sum(abs(i) for i in range(100))


def busy(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tick()  # plain Python calls: what the pacer looks at, and where it may raise


atexit.register(report_exit)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    weights = tf.Variable(tf.ones([8, 8]))
noted = []  # (thread class, paced) each time the replica function is traced


def replica_step():
    profile = sys.getprofile()
    noted.append([type(threading.current_thread()).__name__, type(profile).__name__])
    if TRACE_S and type(profile).__name__ == "Pacer":  # the twin's replica: a slow trace
        busy(TRACE_S)
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
if TRACE_S:
    deadline = time.monotonic() + WAIT_S
    while not any(paced == "Pacer" for _, paced in noted) and time.monotonic() < deadline:
        time.sleep(0.1)  # until the twin's first replica is inside its slow trace
    time.sleep(1.0)
    print(f"exiting {time.monotonic():.3f}", flush=True)
    sys.exit(0)
deadline = time.monotonic() + WAIT_S
while detail_twin.preparing() and time.monotonic() < deadline:  # queued, not prepared
    time.sleep(0.2)
report = {"noted": noted, "generations": detail_twin.generations()}
print("THREADS " + json.dumps(report), flush=True)
print("done", flush=True)
