"""A MirroredStrategy job in one process over REPLICAS logical CPU devices (collective ops, RING
on CPU: MirroredStrategy's default over several devices): Keras ``fit`` (KERAS=tf_keras, the
default, or KERAS=keras: Keras 3) or, with LOOP=custom, a custom loop (``strategy.run`` in a
tf.function). The replica SLOW_REPLICA sleeps SLOW_S inside the steps in SLOW_STEPS before its
forward pass (its gradients reach the all-reduce late).

Env: STEPS (default 12), LOOP (fit | custom), REPLICAS (default 2), SLOW_REPLICA (default -1),
SLOW_STEPS (comma-separated), SLOW_S (default 0.2). Prints "REPLICAS <n> <strategy's cross-device
ops class>", "SLEPT {...}" (step -> replica -> seconds slept), "READY {...}" (custom loop: step ->
replica -> when its gradients were ready, before the all-reduce; wall ns) and "done".
"""

import json
import os
import threading
import time

REPLICAS = int(os.environ.get("REPLICAS", "2"))
KERAS = os.environ.get("KERAS", "tf_keras")
if KERAS == "tf_keras":
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from truth_step import train_step_with_truth  # noqa: E402

cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(REPLICAS)]
)

if KERAS == "tf_keras":
    import tf_keras as keras  # noqa: E402
else:
    import keras  # noqa: E402

STEPS = int(os.environ.get("STEPS", "12"))
LOOP = os.environ.get("LOOP", "fit")
SLOW_REPLICA = int(os.environ.get("SLOW_REPLICA", "-1"))
SLOW_STEPS = {int(s) for s in os.environ.get("SLOW_STEPS", "").split(",") if s.strip()}
SLOW_S = float(os.environ.get("SLOW_S", "0.2"))
BATCH = 16 * REPLICAS

strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
print(
    f"REPLICAS {strategy.num_replicas_in_sync} "
    f"{type(strategy.extended._cross_device_ops).__name__}",
    flush=True,
)
current = {"step": -1}
slept: dict = {}
ready: dict = {}  # custom loop: step -> replica -> when its gradients were ready (wall ns)
lock = threading.Lock()


def delay(x, replica):
    """The injected lateness of one replica in one step (runs inside the step)."""
    step, replica = current["step"], int(replica)
    if replica == SLOW_REPLICA and step in SLOW_STEPS:
        time.sleep(SLOW_S)
        with lock:
            slept.setdefault(step, {})[replica] = SLOW_S
    return x


def delayed(x):
    context = tf.distribute.get_replica_context()
    if context is None:  # the model built in the strategy's scope (cross-replica)
        return x
    replica = context.replica_id_in_sync_group
    out = tf.numpy_function(delay, [x, replica], tf.float32, stateful=True)
    out.set_shape(x.shape)
    return out


class Delayed(keras.layers.Layer):
    def call(self, x):
        return delayed(x)


def dataset() -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * 8, 32)).astype("float32")
    y = rng.normal(size=(BATCH * 8, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)


with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((32,)),
            Delayed(),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    optimizer = keras.optimizers.SGD(0.01)


class Step(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        current["step"] = batch


def mark_ready(replica):
    with lock:
        ready.setdefault(current["step"], {})[int(replica)] = time.time_ns()
    return np.float32(0)


if LOOP == "fit":
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(dataset(), epochs=1, steps_per_epoch=STEPS, callbacks=[Step()], verbose=0)
else:
    iterator = iter(strategy.experimental_distribute_dataset(dataset()))

    train_step = train_step_with_truth(tf, strategy, model, optimizer, mark_ready)

    for step in range(STEPS):
        current["step"] = step
        train_step(next(iterator))

print("SLEPT " + json.dumps(slept), flush=True)
print("READY " + json.dumps(ready), flush=True)
print("done", flush=True)
