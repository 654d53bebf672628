"""A program that exits while its detail twin is being traced (issue 45): its tf.function's
Python is slow only inside a twin's trace (TRACE_S of small Python calls), the program calls the
function STEPS times and exits. Prints "exiting <monotonic s>" and, from an exit handler that
runs after tf_otel's, ``EXIT {json}``: the twin counters and generations.
"""

import atexit
import json
import os
import time

import tensorflow as tf

from tf_otel import health
from tf_otel.instrument import detail_twin

TRACE_S = float(os.environ.get("TRACE_S", "300"))
STEPS = int(os.environ.get("STEPS", "3"))


def report():  # registered before the twin thread exists: runs after tf_otel's exit handler
    counters = {k: v for k, v in health.counters.items() if k.startswith("twin")}
    print("EXIT " + json.dumps({"counters": counters, "gens": detail_twin.generations()}))
    print(f"exited {time.monotonic():.3f}", flush=True)


atexit.register(report)
detail_twin.wanted_by(lambda: True)  # a source that wants twins (as collective detail does)
weights = tf.Variable(tf.ones([4, 4]))


def tick():
    return sum(abs(i) for i in range(100))


def busy(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tick()  # plain Python calls: what the pacer looks at, and where it may raise


@tf.function
def step():
    if detail_twin.tracing():
        busy(TRACE_S)  # a model whose trace takes minutes on a busy machine
    weights.assign_add(tf.ones([4, 4]))
    return tf.reduce_sum(weights)


for _ in range(STEPS):
    step()
if TRACE_S < 60:  # the control: a quick trace, prepared before the program exits
    deadline = time.monotonic() + 120
    while detail_twin.preparing() and time.monotonic() < deadline:
        time.sleep(0.1)
else:
    time.sleep(1.0)  # the twin thread is inside the trace
print(f"exiting {time.monotonic():.3f}", flush=True)
