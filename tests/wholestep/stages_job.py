"""A job fed by a real tf.data pipeline from TFRecord files it writes (tests/wholestep): reader,
a sequential map that sleeps SLOW_MS per element (py_function; 0: none), a parallel map, batch,
prefetch. MODE ``keras`` (fit) or ``loop`` (next(it) inside a tf.function). Environment:
DATA_DIR, MODE, STEPS, SLOW_MS, BATCH. Prints ``done steps=N``.
"""

from __future__ import annotations

import os
import time

import numpy as np
import tensorflow as tf

DATA_DIR = os.environ["DATA_DIR"]
MODE = os.environ.get("MODE", "keras")
STEPS = int(os.environ.get("STEPS", "12"))
SLOW_MS = float(os.environ.get("SLOW_MS", "0"))
BATCH = int(os.environ.get("BATCH", "4"))


def write_files() -> list:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(2):
        path = os.path.join(DATA_DIR, f"part-{i}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(32):
                writer.write(rng.integers(0, 255, 64, dtype=np.uint8).tobytes())
        paths.append(path)
    return paths


def slow(x):
    time.sleep(SLOW_MS / 1000.0)
    return x


def slow_stage(record):
    if SLOW_MS <= 0:
        return record
    out = tf.py_function(slow, [record], tf.string)
    out.set_shape([])
    return out


def decode(record):
    x = tf.cast(tf.io.decode_raw(record, tf.uint8)[:16], tf.float32) / 255.0
    x.set_shape([16])
    return x, tf.reduce_mean(x, keepdims=True)


def dataset(paths):
    ds = tf.data.TFRecordDataset(paths).repeat().map(slow_stage)
    return ds.map(decode, num_parallel_calls=2).batch(BATCH).prefetch(1)


def main() -> None:
    paths = write_files()
    model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(1)])
    if MODE == "keras":
        model.compile(optimizer="sgd", loss="mse")
        model.fit(dataset(paths), steps_per_epoch=STEPS, epochs=1, verbose=0)
    else:
        optimizer = tf.keras.optimizers.SGD()
        iterator = iter(dataset(paths))

        @tf.function
        def train_step(it):
            x, y = next(it)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        for _ in range(STEPS):
            train_step(iterator)
    print(f"done steps={STEPS}", flush=True)


if __name__ == "__main__":
    main()
