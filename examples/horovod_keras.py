"""Horovod + tf_keras fit with hvd.DistributedOptimizer (TF_USE_LEGACY_KERAS=1 is set here:
Keras 3 with DistributedOptimizer does not average gradients).

Run: horovodrun -np 2 -H localhost:2 python examples/horovod_keras.py
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

hvd.init()
STEPS = int(os.environ.get("STEPS", "20"))
BATCH = 16
keras = tf.keras
rng = np.random.default_rng(hvd.rank())
features = rng.normal(size=(STEPS * BATCH, 16)).astype("float32")
labels = (features.sum(axis=1, keepdims=True) > 0).astype("float32")

model = keras.Sequential([keras.layers.Dense(32, "relu", input_shape=(16,)), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
history = model.fit(
    features,
    labels,
    batch_size=BATCH,
    epochs=1,
    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    verbose=0,
)
print(f"rank {hvd.rank()} done steps={STEPS} loss={history.history['loss'][-1]:.6f}")
