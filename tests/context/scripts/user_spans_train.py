"""A training job that makes its own spans and log records with the OpenTelemetry API and Python
logging, before training, during steps and between steps. Every span / record says which step
the script itself counts it in (``test.step``; -1: before training) and its rank.

Run (tests/context/test_step_context_run.py): TF_OTEL_ENABLED=1 OTEL_LOGS_EXPORTER=otlp
horovodrun -np 2 python tests/context/scripts/user_spans_train.py   MODE=loop | keras
"""

import logging
import os
import threading
import time

MODE = os.environ.get("MODE", "loop")
if MODE == "keras":
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # DistributedOptimizer averages (tf_keras)

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from opentelemetry import trace  # noqa: E402

hvd.init()
RANK = hvd.rank()
STEPS = int(os.environ.get("STEPS", "6"))
tracer = trace.get_tracer("user-train")
log = logging.getLogger("user-train")
log.setLevel(logging.INFO)
current = [-1]  # the step this script is in, counted by itself (set just before each step)


def mark(name: str, step: int) -> None:
    """One user span and one log record, both naming the step this script counts them in and
    the thread that made them (tf_otel's twin thread reruns the step function's Python)."""
    thread = threading.current_thread().name
    attributes = {"test.step": step, "test.rank": RANK, "test.thread": thread}
    with tracer.start_as_current_span(name, attributes=attributes):
        log.info(name, extra={"test_step": step, "test_rank": RANK, "test_thread": thread})


mark("before training", -1)
rng = np.random.default_rng(RANK)
features = rng.normal(size=(STEPS * 8, 16)).astype("float32")
labels = (features.sum(axis=1, keepdims=True) > 0).astype("float32")

if MODE == "loop":
    import horovod.tensorflow as hvd_tf

    w = tf.Variable(tf.random.stateless_normal([16, 1], seed=(1, 2)) * 0.1)
    hvd_tf.broadcast_variables([w], root_rank=0)

    @tf.function
    def train_step(x, y):
        mark("during trace", current[0])  # Python runs while a call traces: inside that step
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
        tape = hvd_tf.DistributedGradientTape(tape)
        (grad,) = tape.gradient(loss, [w])
        w.assign_sub(0.01 * grad)
        return loss

    for step in range(STEPS):
        current[0] = step
        train_step(features[step * 8 : step * 8 + 8], labels[step * 8 : step * 8 + 8])
        mark(f"between {step}", step)  # after step N returned, before N+1: step N's trace
else:
    keras = tf.keras

    class Model(keras.Sequential):
        def train_step(self, data):
            mark("during trace", current[0])  # runs while the train function traces: a step
            return super().train_step(data)

    class Marks(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            current[0] = batch  # one epoch: the batch is the step

        def on_train_batch_end(self, batch, logs=None):
            mark(f"between {batch}", batch)  # after step `batch`, before the next

    model = Model([keras.layers.Dense(8, "relu", input_shape=(16,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    model.fit(
        features,
        labels,
        batch_size=8,
        epochs=1,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Marks()],
        verbose=0,
    )
# what is checked here includes the spans and records the detail twin's trace makes (it reruns
# the step function's Python on tf_otel's thread): let that trace end before the exit, which
# would abandon it part-way (a span without its record)
from tf_otel.instrument import detail_twin  # noqa: E402

deadline = time.monotonic() + 120
while detail_twin.preparing() and time.monotonic() < deadline:
    time.sleep(0.1)
print(f"rank {RANK} done mode={MODE} steps={STEPS}", flush=True)
