"""A Horovod Elastic custom loop (``hvd.elastic.run`` with ``TensorFlowKerasState``) whose world
changes while it trains: the discovery script reads HOSTS_FILE, and rank 0 writes SHRINK_TO
slots there when its committed batch reaches SHRINK_AT (GROW_TO at GROW_AT likewise).

Run: horovodrun -np 3 --min-np 2 --max-np 3 --network-interface lo \
        --host-discovery-script tests/reliability/scripts/elastic_discover.sh \
        python tests/reliability/scripts/elastic_train.py
Env: HOSTS_FILE (what the discovery script prints), STEPS (default 30), STEP_SLEEP_S (0.1),
SHRINK_AT / SHRINK_TO (SHRINK_HOSTS: the hosts then, "localhost:<SHRINK_TO>" by default, ","
between hosts), GROW_AT / GROW_TO / GROW_HOSTS (-1: never; the run goes on past STEPS, up to
MAX_STEPS (4 x STEPS), until the world has had the size asked for 5 batches), TRUTH_DIR (each
process appends "<pid> <rank> <size> <batch> <host>" per call of train_step to
TRUTH_DIR/truth-<pid>.txt; the first call, batch -1, builds the model before the elastic state
copies it).
"""

import os
import socket
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

hvd.init()
STEPS = int(os.environ.get("STEPS", "30"))
STEP_SLEEP_S = float(os.environ.get("STEP_SLEEP_S", "0.1"))
HOSTS_FILE = os.environ["HOSTS_FILE"]
MAX_STEPS = int(os.environ.get("MAX_STEPS", str(4 * STEPS)))
SHRINK_TO, GROW_TO = os.environ.get("SHRINK_TO", ""), os.environ.get("GROW_TO", "")
CHANGES = {  # batch -> what the discovery script prints from then on ("," between hosts)
    int(os.environ.get("SHRINK_AT", "-1")): os.environ.get(
        "SHRINK_HOSTS", f"localhost:{SHRINK_TO}"
    ),
    int(os.environ.get("GROW_AT", "-1")): os.environ.get("GROW_HOSTS", f"localhost:{GROW_TO}"),
}
TRUTH = os.path.join(os.environ.get("TRUTH_DIR", "."), f"truth-{os.getpid()}.txt")

rng = np.random.default_rng(0)
features = tf.constant(rng.normal(size=(32, 16)).astype("float32"))
labels = tf.constant(rng.normal(size=(32, 1)).astype("float32"))
model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(16,))])
optimizer = tf.keras.optimizers.SGD(0.01)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


def step(batch):
    """One call of train_step, and its truth line: the process's calls in order."""
    train_step(features, labels)
    with open(TRUTH, "a") as out:
        out.write(f"{os.getpid()} {hvd.rank()} {hvd.size()} {batch} {socket.gethostname()}\n")


AFTER = 5  # batches the changed world trains at least


def going_on(state):
    """STEPS batches, and on until a change asked for has come and the new world has trained
    AFTER batches (the driver acts on the discovery script's answer 1-5 s later on a loaded
    machine), up to MAX_STEPS. The same answer on every rank: it reads the synced state."""
    target = int(GROW_TO or SHRINK_TO or 0)
    if target and state.since < 0 and hvd.size() == target:
        state.since = state.batch
    if state.batch < STEPS:
        return True
    waiting = target and (state.since < 0 or state.batch < state.since + AFTER)
    return bool(waiting) and state.batch < MAX_STEPS


@hvd.elastic.run
def train(state):
    while going_on(state):
        time.sleep(STEP_SLEEP_S)
        step(state.batch)
        print(f"rank {hvd.rank()} size {hvd.size()} batch {state.batch}", flush=True)
        state.batch += 1
        if hvd.rank() == 0 and CHANGES.get(state.batch):
            hosts = CHANGES[state.batch]
            with open(HOSTS_FILE, "w") as out:
                out.write(hosts.replace(",", "\n") + "\n")
            print(f"hosts -> {hosts} at batch {state.batch}", flush=True)
        state.commit()


step(-1)  # builds the model and optimizer before the state copies them (a step of its own)
# since: the batch the world first had the size asked for (-1: not yet)
state = hvd.elastic.TensorFlowKerasState(model, optimizer, batch=0, since=-1)
train(state)
print(f"rank {hvd.rank()} done size {hvd.size()}", flush=True)
