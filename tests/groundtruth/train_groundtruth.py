"""Ground-truth training job: a Horovod loop in which one rank is slowed in known steps.

Run (4 ranks on one host)::

    SCENARIO=input SLOW_RANK=2 SLOW_STEPS=4,7 DELAY_MS=300 STEPS=10 \
    TRUTH_FILE=/tmp/truth-{rank}.json TF_OTEL_ENABLED=1 TF_OTEL_STEP_FUNCTIONS=train_step \
    horovodrun -np 4 -H localhost:4 --gloo python tests/groundtruth/train_groundtruth.py

SCENARIO:
  ``late``    the slow rank sleeps DELAY_MS before it begins the step (outside the step);
  ``input``   the slow rank's tf.data generator sleeps DELAY_MS producing that step's batch;
  ``compute`` the slow rank trains that step on a BIG_BATCH-times larger batch (real extra work;
              the big batch is run once before training so the step pays no first-call cost);
  ``none``    nothing is injected (the control).

Every rank writes TRUTH_FILE ({rank} replaced): per step, its own work before the gradient
allreduce (``work_ns``: from the loop iteration's start to the moment its local gradients are
ready, on its monotonic clock) and that moment on the host's wall clock (``ready_ns``: on one
host every rank's ``ready_ns`` is on the same clock, so a rank's lateness is its ready time minus
the others' median) - measured in-process, independent of tf_otel's spans. A tiny model and
few steps: the job has to fit the 2-core CI budget.
"""

import json
import os
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

hvd.init()
RANK = hvd.rank()
SCENARIO = os.environ.get("SCENARIO", "none")
STEPS = int(os.environ.get("STEPS", "10"))
SLOW_RANK = int(os.environ.get("SLOW_RANK", "-1"))
SLOW_STEPS = {int(s) for s in os.environ.get("SLOW_STEPS", "").split(",") if s.strip()}
DELAY_S = float(os.environ.get("DELAY_MS", "0")) / 1000.0
BATCH = int(os.environ.get("BATCH", "32"))
BIG_BATCH = int(os.environ.get("BIG_BATCH", "256"))  # times BATCH, scenario compute
WIDTH = int(os.environ.get("WIDTH", "512"))
TRUTH_FILE = os.environ.get("TRUTH_FILE", "")


def slowed(step: int) -> bool:
    return RANK == SLOW_RANK and step in SLOW_STEPS


def batches():
    for step in range(STEPS):
        if SCENARIO == "input" and slowed(step):
            time.sleep(DELAY_S)  # a slow input pipeline: this batch takes longer to make
        yield step


dataset = tf.data.Dataset.from_generator(batches, output_signature=tf.TensorSpec((), tf.int64))
options = tf.data.Options()
options.autotune.enabled = False
options.experimental_optimization.inject_prefetch = False  # no overlap: the wait is the delay
dataset = dataset.with_options(options)

rng = np.random.default_rng(RANK)
small = tf.constant(rng.normal(size=(BATCH, 64)).astype("float32"))
big = tf.constant(rng.normal(size=(BATCH * BIG_BATCH, 64)).astype("float32"))
w1 = tf.Variable(tf.random.stateless_normal([64, WIDTH], seed=(1, 2)) * 0.1)
w2 = tf.Variable(tf.random.stateless_normal([WIDTH, WIDTH], seed=(3, 4)) * 0.05)
w3 = tf.Variable(tf.random.stateless_normal([WIDTH, 1], seed=(5, 6)) * 0.1)
variables = [w1, w2, w3]
hvd.broadcast_variables(variables, root_rank=0)
ready_marks = []


def mark(*grads):
    # local gradients are ready: the rank's own work ends here
    ready_marks.append((time.perf_counter_ns(), time.time_ns()))
    return grads


def local_gradients(x):
    with tf.GradientTape() as tape:
        hidden = tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2))
        loss = tf.reduce_mean(tf.square(tf.matmul(hidden, w3)))
    return loss, tape.gradient(loss, variables)


# not a step (TF_OTEL_STEP_FUNCTIONS=train_step): pays the big batch's first-call costs
warm_up = tf.function(local_gradients, input_signature=[tf.TensorSpec([None, 64], tf.float32)])
if SCENARIO == "compute" and RANK == SLOW_RANK:
    warm_up(big)


@tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
def train_step(x):
    loss, grads = local_gradients(x)
    marked = tf.numpy_function(mark, grads, [g.dtype for g in grads], stateful=True)
    grads = [tf.ensure_shape(m, g.shape) for m, g in zip(marked, grads)]
    grads = [hvd.allreduce(g, op=hvd.Average) for g in grads]
    for var, grad in zip(variables, grads):
        var.assign_sub(0.01 * grad)
    return loss


work_ns, ready_ns = {}, {}
iterator = iter(dataset)
for step in range(STEPS):
    begin = time.perf_counter_ns()
    if SCENARIO == "late" and slowed(step):
        time.sleep(DELAY_S)  # the rank begins this step late
    next(iterator)
    x = big if SCENARIO == "compute" and slowed(step) else small
    train_step(x)
    work_ns[step] = ready_marks[-1][0] - begin
    ready_ns[step] = ready_marks[-1][1]
if TRUTH_FILE:
    with open(TRUTH_FILE.replace("{rank}", str(RANK)), "w") as handle:
        truth = {"rank": RANK, "scenario": SCENARIO, "work_ns": work_ns, "ready_ns": ready_ns}
        json.dump(truth, handle)
print(f"rank {RANK} done steps={STEPS} scenario={SCENARIO}")
