"""Horovod custom loop: DistributedGradientTape inside a tf.function over plain tf.Variables.

Run: horovodrun -np 2 -H localhost:2 python examples/horovod_tape.py
SLOW_RANK / SLOW_MS / SLOW_STEPS (comma list) delay one rank before its gradients (stragglers).
READY_STAMPS=1 prints, at the end, when each step's loss was ready on this rank (wall-clock ns,
after any delay, before the gradients: "READY <rank> {step: ns}") and when its local gradients
were, just before their all-reduce ("SENT <rank> {step: ns}"; the gradients are then computed
with a plain tape and all-reduced with hvd.allreduce, so the stamp can sit between the two):
the truth a test checks a named straggler against. And the longest any one of its threads
waited for a CPU in each step (the kernel's schedstat: "STARVED <rank> {step: ns}"), for a
hiccup after those stamps (Horovod's own thread).
IMPORT_MPI4PY=1 imports mpi4py first (mpirun with mpi4py in the same process); KILL_RANK /
KILL_STEP: that rank SIGTERMs itself at that step (a job killed mid-run).
"""

import json
import os
import signal
import time

if os.environ.get("IMPORT_MPI4PY") == "1":
    from mpi4py import MPI  # noqa: F401

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

hvd.init()
STEPS = int(os.environ.get("STEPS", "20"))
SLOW_RANK = int(os.environ.get("SLOW_RANK", "-1"))
SLOW_MS = float(os.environ.get("SLOW_MS", "0"))
SLOW_STEPS = {int(s) for s in os.environ.get("SLOW_STEPS", "").split(",") if s.strip()}
KILL_RANK = int(os.environ.get("KILL_RANK", "-1"))
KILL_STEP = int(os.environ.get("KILL_STEP", "-1"))
READY_STAMPS = os.environ.get("READY_STAMPS") == "1"
ready_ns = {}
sent_ns = {}
starved_ns = {}


def run_delays():
    """Thread id -> how long it has waited for a CPU so far (ns, /proc/<pid>/task/*/schedstat)."""
    found = {}
    tasks = f"/proc/{os.getpid()}/task"
    for tid in os.listdir(tasks):
        try:
            with open(f"{tasks}/{tid}/schedstat") as stats:
                found[tid] = int(stats.read().split()[1])
        except (OSError, ValueError, IndexError):
            pass  # the thread ended
    return found


rng = np.random.default_rng(hvd.rank())
features = tf.constant(rng.normal(size=(64, 32)).astype("float32"))
labels = tf.constant(rng.normal(size=(64, 1)).astype("float32"))
w1 = tf.Variable(tf.random.stateless_normal([32, 64], seed=(1, 2)) * 0.1, name="dense1/kernel")
w2 = tf.Variable(tf.random.stateless_normal([64, 1], seed=(3, 4)) * 0.1, name="dense2/kernel")
variables = [w1, w2]
hvd.broadcast_variables(variables, root_rank=0)


def delay():
    time.sleep(SLOW_MS / 1000.0)
    return np.float32(0)


def ready(loss):
    ready_ns[len(ready_ns)] = time.time_ns()  # once a step, in order: the step's number
    return np.float32(0)


def sent(*grads):
    sent_ns[len(sent_ns)] = time.time_ns()
    return np.float32(0)


@tf.function
def train_step(x, y, slow):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2) - y))
        if slow:
            loss += tf.numpy_function(delay, [], tf.float32, stateful=True)
        if READY_STAMPS:  # after the delay (it reads the loss), before the gradients
            loss += tf.numpy_function(ready, [loss], tf.float32, stateful=True)
    if READY_STAMPS:  # the backward pass can hold a rank up after its loss was ready
        grads = tape.gradient(loss, variables)
        stamp = tf.numpy_function(sent, grads, tf.float32, stateful=True)
        with tf.control_dependencies([stamp]):
            grads = [hvd.allreduce(tf.identity(grad)) for grad in grads]
    else:
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, variables)
    for var, grad in zip(variables, grads):
        var.assign_sub(0.01 * grad)
    return loss


for step in range(STEPS):
    if hvd.rank() == KILL_RANK and step == KILL_STEP:
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    slow = hvd.rank() == SLOW_RANK and step in SLOW_STEPS
    before = run_delays() if READY_STAMPS else {}
    loss = train_step(features, labels, tf.constant(slow))
    if READY_STAMPS:
        waits = [ns - before.get(tid, 0) for tid, ns in run_delays().items()]
        starved_ns[step] = max(waits, default=0)
if READY_STAMPS:
    print(f"READY {hvd.rank()} {json.dumps(ready_ns)}", flush=True)
    print(f"SENT {hvd.rank()} {json.dumps(sent_ns)}", flush=True)
    print(f"STARVED {hvd.rank()} {json.dumps(starved_ns)}", flush=True)
print(f"rank {hvd.rank()} done steps={STEPS} loss={float(loss):.6f}")
