"""A MultiWorkerMirroredStrategy job of WORKERS tasks (TF_CONFIG, given by the test): Keras
``fit`` (tf_keras) or, with LOOP=custom, a custom loop (``strategy.run`` in a tf.function). The
worker SLOW_WORKER sleeps SLOW_S before each step in SLOW_STEPS (it begins them late).

Env: STEPS (default 20), LOOP (fit | custom), WIDTH (default 256: Dense layers 32 -> WIDTH ->
WIDTH -> 1, float32 gradients), SLOW_WORKER (default -1), SLOW_STEPS (comma-separated),
SLOW_S (default 0.3), TRUTH_FILE (with {rank}: {"begun": each step's call, "ready" and "applied"
(custom loop only): the moments its gradients were computed, before their all-reduce, and its
variables updated, after it; wall clock, ns}),
NO_COORDINATION_SERVICE (1: the strategy starts no coordination service, as where a program
turned it off), CLUSTER + TASK_INDEX (instead of TF_CONFIG: the cluster as JSON given to the
strategy by a cluster resolver in code).
Prints one line "GRAPHS {...}" (the program's own traces of its step function: how many, their
collective ops, their timing ops) and "worker I done".
"""

import json
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 3 cannot fit under this strategy

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402
from truth_step import train_step_with_truth  # noqa: E402

STEPS = int(os.environ.get("STEPS", "20"))
LOOP = os.environ.get("LOOP", "fit")
WIDTH = int(os.environ.get("WIDTH", "256"))
SLOW_WORKER = int(os.environ.get("SLOW_WORKER", "-1"))
SLOW_STEPS = {int(s) for s in os.environ.get("SLOW_STEPS", "").split(",") if s.strip()}
SLOW_S = float(os.environ.get("SLOW_S", "0.3"))
TRUTH_FILE = os.environ.get("TRUTH_FILE", "")
BATCH = 16

if os.environ.get("NO_COORDINATION_SERVICE") == "1":
    from tensorflow.python.eager import context

    context.context().configure_coordination_service("")  # the strategy keeps this one: none
if os.environ.get("CLUSTER"):  # the cluster given in code (a resolver), no TF_CONFIG
    worker = int(os.environ["TASK_INDEX"])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(json.loads(os.environ["CLUSTER"])),
        task_type="worker",
        task_id=worker,
        rpc_layer="grpc",
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
else:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    worker = int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
begun = []
ready = []
applied = []


def dataset() -> tf.data.Dataset:
    rng = np.random.default_rng(worker)
    x = rng.normal(size=(BATCH * 8, 32)).astype("float32")
    y = rng.normal(size=(BATCH * 8, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH * 2)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return data.with_options(options)


with strategy.scope():
    model = tf_keras.Sequential(
        [
            tf_keras.layers.Dense(WIDTH, activation="relu", input_shape=(32,)),
            tf_keras.layers.Dense(WIDTH, activation="relu"),
            tf_keras.layers.Dense(1),
        ]
    )
    optimizer = tf_keras.optimizers.SGD(0.01)


def before_step(step: int) -> None:
    if worker == SLOW_WORKER and step in SLOW_STEPS:
        time.sleep(SLOW_S)
    begun.append(time.time_ns())


class Slow(tf_keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        before_step(batch)


if LOOP == "fit":
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(dataset(), epochs=1, steps_per_epoch=STEPS, callbacks=[Slow()], verbose=0)
else:
    iterator = iter(strategy.experimental_distribute_dataset(dataset()))

    def mark_ready(replica):  # one replica a worker
        ready.append(time.time_ns())
        return np.float32(0)

    def mark_applied(replica):
        applied.append(time.time_ns())
        return np.float32(0)

    train_step = train_step_with_truth(tf, strategy, model, optimizer, mark_ready, mark_applied)

    for step in range(STEPS):
        before_step(step)
        train_step(next(iterator))


def timing_ops(graph) -> int:
    return sum(
        op.type == "Timestamp"
        or ("arrive" in op.get_attr("f").name if op.type.endswith("PartitionedCall") else False)
        for op in graph.get_operations()
    )


def graphs_of(function) -> list:
    """Every trace of a tf.function (none where it never ran: each step ran the twin)."""
    return [c.graph for c in function._list_all_concrete_functions_for_serialization()]


function = model.train_tf_function if LOOP == "fit" else train_step
program = graphs_of(function)
report = {
    "worker": worker,
    "program_graphs": len(program),
    "program_collectives": sum(
        op.type.startswith("Collective") for g in program for op in g.get_operations()
    ),
    "program_timing_ops": sum(timing_ops(g) for g in program),
}
print("GRAPHS " + json.dumps(report), flush=True)

if TRUTH_FILE:
    with open(TRUTH_FILE.replace("{rank}", str(worker)), "w") as out:
        json.dump({"begun": begun, "ready": ready, "applied": applied}, out)
print(f"worker {worker} done", flush=True)
