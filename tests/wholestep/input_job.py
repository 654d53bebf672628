"""A training job fed by tf.data from TFRecord files it writes itself (tests/wholestep).

Environment: DATA_DIR (where the files go), MODE (``keras`` | ``loop``: next(it) inside a user
tf.function | ``graphloop``: ``for x, y in ds`` inside a user tf.function, LOOP_BATCHES batches a
call, each call a step; LOOP_CACHE=1: those batches cached in memory after the first call |
``checkpoint``: Keras fit, then a user's iterator checkpointed, restored and fed to 3 steps of a
custom loop),
STEPS, SLOW_MS (a decode stage that sleeps this long per batch; 0: none), MODEL_MS (the
training step works this long beyond its ~1 ms model: a sleep inside the step; keras / loop),
FILES / RECORDS / RECORD_BYTES (the files written), CALLBACK_SLEEP_MS / CALLBACK_EVERY
(a Keras callback that sleeps every Nth batch), SAVE_EVERY (checkpoint writes in the loop).
Prints ``done steps=N file_bytes=B slow_ms_median=M slow_ms_p10=L slow_ms_p90=H`` (the slow
stage's real time: median, 10th and 90th percentile) and ``slow_ready_ns=T1,T2,...`` (the wall
clock, time.time_ns, when each slow stage finished: the batch became ready for the consumer).
"""

from __future__ import annotations

import os
import time

import numpy as np
import tensorflow as tf

DATA_DIR = os.environ["DATA_DIR"]
MODE = os.environ.get("MODE", "keras")
STEPS = int(os.environ.get("STEPS", "20"))
SLOW_MS = float(os.environ.get("SLOW_MS", "0"))
FILES = int(os.environ.get("FILES", "2"))
RECORDS = int(os.environ.get("RECORDS", "64"))
RECORD_BYTES = int(os.environ.get("RECORD_BYTES", "4096"))
BATCH = int(os.environ.get("BATCH", "4"))
CALLBACK_SLEEP_MS = float(os.environ.get("CALLBACK_SLEEP_MS", "0"))
CALLBACK_EVERY = int(os.environ.get("CALLBACK_EVERY", "10"))
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "0"))
LOOP_BATCHES = int(os.environ.get("LOOP_BATCHES", "8"))
LOOP_CACHE = os.environ.get("LOOP_CACHE") == "1"
MODEL_MS = float(os.environ.get("MODEL_MS", "0"))


def write_files() -> list:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(FILES):
        path = os.path.join(DATA_DIR, f"part-{i}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(RECORDS):
                payload = rng.integers(0, 255, RECORD_BYTES, dtype=np.uint8).tobytes()
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[payload]))
                        }
                    )
                )
                writer.write(example.SerializeToString())
        paths.append(path)
    return paths


SLOW_TIMES: list = []  # what each slow stage really took (a loaded host oversleeps)
SLOW_READY: list = []  # when each slow stage finished (wall clock, as spans are stamped)


def slow(x):
    start = time.perf_counter()
    time.sleep(SLOW_MS / 1000.0)
    SLOW_TIMES.append(time.perf_counter() - start)
    SLOW_READY.append(time.time_ns())
    return x


def decode(batch):
    parsed = tf.io.parse_example(batch, {"x": tf.io.FixedLenFeature([], tf.string)})
    x = tf.io.decode_raw(parsed["x"], tf.uint8)[:, :16]
    x = tf.cast(x, tf.float32) / 255.0
    if SLOW_MS > 0:
        x = tf.py_function(slow, [x], tf.float32)
        x.set_shape([None, 16])
    return x, tf.reduce_mean(x, axis=1, keepdims=True)


def _model_work(loss):
    time.sleep(MODEL_MS / 1000.0)
    return loss


def step_loss(y, prediction):
    """The mean squared error, after MODEL_MS of work inside the step (a model of that size
    without depending on which CPU kernels TF picks)."""
    loss = tf.reduce_mean((prediction - y) ** 2)
    if MODEL_MS > 0:
        loss = tf.py_function(_model_work, [loss], tf.float32)
        loss.set_shape([])
    return loss


def dataset(paths, repeat=True):
    ds = tf.data.TFRecordDataset(paths)
    if repeat:
        ds = ds.repeat()
    return ds.batch(BATCH).map(decode).prefetch(1)


class Stall(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch % CALLBACK_EVERY == CALLBACK_EVERY - 1:
            time.sleep(CALLBACK_SLEEP_MS / 1000.0)


def main() -> None:
    paths = write_files()
    file_bytes = sum(os.path.getsize(p) for p in paths)
    model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(1)])
    if MODE == "keras":
        model.compile(optimizer="sgd", loss=step_loss)
        callbacks = [Stall()] if CALLBACK_SLEEP_MS > 0 else []
        model.fit(dataset(paths), steps_per_epoch=STEPS, epochs=1, verbose=0, callbacks=callbacks)
    elif MODE == "readonce":
        model.compile(optimizer="sgd", loss="mse")
        model.fit(dataset(paths, repeat=False), epochs=1, verbose=0)
    elif MODE == "checkpoint":  # Keras fit, then a user's iterator saved and restored
        model.compile(optimizer="sgd", loss="mse")
        model.fit(dataset(paths), steps_per_epoch=STEPS, epochs=1, verbose=0)
        iterator = iter(dataset(paths, repeat=False))
        next(iterator)
        saved = tf.train.Checkpoint(iterator=iterator).save(os.path.join(DATA_DIR, "it"))
        expected = next(iterator)[0].numpy()
        restored = iter(dataset(paths, repeat=False))
        tf.train.Checkpoint(iterator=restored).restore(saved)
        assert np.array_equal(next(restored)[0].numpy(), expected)
        print("checkpoint restored the next element", flush=True)

        @tf.function
        def predict_step(x):  # a custom loop's step on a batch its eager next() took
            return tf.reduce_sum(model(x))

        for _ in range(3):
            x, _ = next(restored)
            predict_step(x)
    elif MODE == "graphloop":
        optimizer = tf.keras.optimizers.SGD()
        batches = dataset(paths).take(LOOP_BATCHES)
        if LOOP_CACHE:
            batches = batches.cache()

        @tf.function
        def train_steps():
            total = tf.constant(0.0)
            for x, y in batches:  # AutoGraph: a scan + reduce over the dataset in the graph
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((model(x) - y) ** 2)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                total += loss
            return total

        for _ in range(STEPS):
            train_steps()
    else:
        optimizer = tf.keras.optimizers.SGD()
        iterator = iter(dataset(paths))
        checkpoint = tf.train.Checkpoint(model=model)

        @tf.function
        def train_step(it):
            x, y = next(it)
            with tf.GradientTape() as tape:
                loss = step_loss(y, model(x))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        for step in range(STEPS):
            train_step(iterator)
            if SAVE_EVERY and step % SAVE_EVERY == SAVE_EVERY - 1:
                checkpoint.write(os.path.join(DATA_DIR, "ckpt"))
    times = sorted(SLOW_TIMES) or [0.0]

    def quantile(q: float) -> float:
        return 1000 * times[int(q * (len(times) - 1))]

    print(
        f"done steps={STEPS} file_bytes={file_bytes} slow_ms_median={quantile(0.5):.3f}"
        f" slow_ms_p10={quantile(0.1):.3f} slow_ms_p90={quantile(0.9):.3f}"
        f" slow_ready_ns={','.join(map(str, SLOW_READY)) or '-'}",
        flush=True,
    )


if __name__ == "__main__":
    main()
