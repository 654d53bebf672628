"""A DistributedGradientTape loop whose detail twin is slow to trace (issue 45): the Python body
sleeps TRACE_SLEEP_S while a twin traces it, so several picked steps come before the twin is
prepared on every rank. STEPS steps, STEP_SLEEP_S between them. Each rank prints one line
``TWIN {json}``: which threads traced the twin, the training thread's name, tf_otel's counters.
"""

import json
import os
import threading
import time

import horovod.tensorflow as hvd
import tensorflow as tf

from tf_otel import health
from tf_otel.instrument import cpu_pacer, detail_twin

# what is checked here is the ranks' agreement, not the pacing (tests/test_cpu_pacer.py): the
# trace may use half a core however busy the test machine is, so it ends inside the job
cpu_pacer.FLOOR = cpu_pacer.CEILING
hvd.init()
STEPS = int(os.environ.get("STEPS", "40"))
TRACE_SLEEP_S = float(os.environ.get("TRACE_SLEEP_S", "2.0"))
STEP_SLEEP_S = float(os.environ.get("STEP_SLEEP_S", "0.05"))

x = tf.random.stateless_normal([16, 32], seed=(hvd.rank(), 1))
variables = [
    tf.Variable(tf.random.stateless_normal([32, 32], seed=(i, 2)) * 0.1, name=f"w{i}")
    for i in range(3)
]
traced_on = []  # (inside a twin's trace, thread name), one per trace


@tf.function
def train_step():
    traced_on.append((detail_twin.tracing(), threading.current_thread().name))
    if detail_twin.tracing():
        time.sleep(TRACE_SLEEP_S)  # a model whose trace takes seconds
    with tf.GradientTape() as tape:
        h = x
        for v in variables:
            h = tf.nn.relu(tf.matmul(h, v))
        loss = tf.reduce_mean(h)
    grads = hvd.DistributedGradientTape(tape).gradient(loss, variables)
    for v, g in zip(variables, grads):
        v.assign_sub(0.01 * g)
    return loss


for _ in range(STEPS):
    loss = train_step()
    time.sleep(STEP_SLEEP_S)
report = {
    "rank": hvd.rank(),
    "main": threading.current_thread().name,
    "traced_on": traced_on,
    "counters": {
        k: v for k, v in health.counters.items() if k.startswith(("twin", "error", "coordinator"))
    },
}
print("TWIN " + json.dumps(report), flush=True)
print(f"rank {hvd.rank()} done steps={STEPS} loss={float(loss):.6f}", flush=True)
