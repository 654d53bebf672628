"""A tf.function loop for the resource-detail steps (tests/wholestep). Environment: DATA_DIR,
MODE ``alloc`` (odd steps allocate and free ALLOC_MB inside the step, even steps do not) or
``files`` (a tf.data pipeline whose Python reader reads files of known sizes, CHUNK bytes per
element, BATCH elements per step; NO_READ=1: the same pipeline reading nothing) or ``tfrecord``
(TFRecordDataset over two files, BATCH records per step). Prints
``done steps=N`` and, for ``files``, ``file <path> <bytes>`` per file.
"""

from __future__ import annotations

import os
import time

import numpy as np
import tensorflow as tf

DATA_DIR = os.environ["DATA_DIR"]
MODE = os.environ.get("MODE", "alloc")
STEPS = int(os.environ.get("STEPS", "8"))
ALLOC_MB = int(os.environ.get("ALLOC_MB", "256"))
CHUNK = int(os.environ.get("CHUNK", "4096"))
BATCH = int(os.environ.get("BATCH", "64"))
NO_READ = os.environ.get("NO_READ") == "1"
SIZES_MB = (2, 3, 4)


def allocate(step):
    if int(step) % 2 == 1:
        buffer = np.ones(ALLOC_MB * 2**20, np.uint8)  # every page touched
        time.sleep(0.02)
        del buffer
    return np.float32(0)


def alloc_loop() -> None:
    weight = tf.Variable(1.0)

    @tf.function
    def train_step(step):
        out = tf.numpy_function(allocate, [step], tf.float32)
        return weight.assign_add(out)

    for step in range(STEPS):
        train_step(tf.constant(step))
    print(f"done steps={STEPS}", flush=True)


def write_files() -> list:
    paths = []
    for i, mb in enumerate(SIZES_MB):
        path = os.path.join(DATA_DIR, f"data-{i}.bin")
        with open(path, "wb") as f:
            f.write(os.urandom(mb * 2**20))
        paths.append(path)
    return paths


def files_loop() -> None:
    paths = write_files()

    def chunks():
        if NO_READ:
            for _ in range(sum(SIZES_MB) * 2**20 // CHUNK):
                yield np.float32(CHUNK)
            return
        for path in paths:
            with open(path, "rb") as f:
                while True:
                    chunk = f.read(CHUNK)
                    if not chunk:
                        break
                    yield np.float32(len(chunk))

    options = tf.data.Options()
    # no read-ahead: each step's reads happen inside it (the ground truth is per step)
    options.experimental_optimization.inject_prefetch = False
    ds = tf.data.Dataset.from_generator(chunks, output_signature=tf.TensorSpec([], tf.float32))
    iterator = iter(ds.batch(BATCH).with_options(options))
    total = tf.Variable(0.0)

    @tf.function
    def train_step(it):
        return total.assign_add(tf.reduce_sum(next(it)))

    steps = -(-sum(SIZES_MB) * 2**20 // (CHUNK * BATCH))
    for _ in range(steps):
        train_step(iterator)
    for path in paths:
        print(f"file {path} {os.path.getsize(path)}", flush=True)
    print(f"done steps={steps} read={int(total.numpy())}", flush=True)


def tfrecord_loop() -> None:
    paths = []
    for i in range(2):
        path = os.path.join(DATA_DIR, f"part-{i}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(256):
                writer.write(os.urandom(4096))
        paths.append(path)
    ds = tf.data.TFRecordDataset(paths).map(lambda r: tf.strings.length(r)).batch(BATCH)
    iterator = iter(ds)
    total = tf.Variable(0)

    @tf.function
    def train_step(it):
        return total.assign_add(tf.reduce_sum(next(it)))

    for _ in range(STEPS):
        train_step(iterator)
    print(f"done steps={STEPS}", flush=True)


if __name__ == "__main__":
    {"alloc": alloc_loop, "files": files_loop, "tfrecord": tfrecord_loop}[MODE]()
