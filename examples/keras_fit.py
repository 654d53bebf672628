"""Keras fit / evaluate / predict on random data (Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1).

STEPS batches per epoch, EPOCHS epochs, STEPS_PER_EXECUTION batches per train-function call;
SLEEP_MS adds a per-batch delay in the input pipeline (to make ~20 ms steps for benchmarks).
"""

import os
import time

import numpy as np
import tensorflow as tf

STEPS = int(os.environ.get("STEPS", "20"))
EPOCHS = int(os.environ.get("EPOCHS", "1"))
BATCH = int(os.environ.get("BATCH", "16"))
SPE = int(os.environ.get("STEPS_PER_EXECUTION", "1"))
SLEEP_MS = float(os.environ.get("SLEEP_MS", "0"))
WIDTH = int(os.environ.get("WIDTH", "32"))
keras = tf.keras

rng = np.random.default_rng(0)
features = rng.normal(size=(STEPS * BATCH, 16)).astype("float32")
labels = (features.sum(axis=1, keepdims=True) > 0).astype("float32")
data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH)
if SLEEP_MS:

    def slow(x, y):
        time.sleep(SLEEP_MS / 1000.0)
        return x, y

    data = data.map(lambda x, y: tf.numpy_function(slow, [x, y], (tf.float32, tf.float32)))

hidden = 2 if WIDTH > 32 else 1  # WIDTH > 32: a heavier model, for ~20 ms steps in benchmarks
layers = [keras.Input((16,))] + [keras.layers.Dense(WIDTH, "relu") for _ in range(hidden)]
layers.append(keras.layers.Dense(1))
model = keras.Sequential(layers)
model.compile(optimizer="sgd", loss="mse", steps_per_execution=SPE)
if os.environ.get("PRINT_TIMING") == "1":  # warm up: trace and compile before timing
    model.fit(data.repeat(), epochs=1, steps_per_epoch=3, verbose=0)
started = time.perf_counter()
history = model.fit(data.repeat(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
fit_seconds = time.perf_counter() - started
if os.environ.get("EVALUATE", "1") == "1":
    model.evaluate(data, verbose=0)
    model.predict(features[: BATCH * 2], batch_size=BATCH, verbose=0)
print(f"done steps={STEPS} loss={history.history['loss'][-1]:.6f}")
if os.environ.get("PRINT_TIMING") == "1":
    print(f"fit_seconds={fit_seconds:.6f}")
