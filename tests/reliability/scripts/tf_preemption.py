"""TF's own preemption handling: tf.distribute.experimental.PreemptionCheckpointHandler installs a
SIGTERM handler that saves a checkpoint at the next step and exits with its own status (42).

Usage: python tf_preemption.py CHECKPOINT_DIR   (prints "ready" once training runs)
"""

import os
import signal
import sys
import time

import tensorflow as tf

os.environ.pop("TF_CONFIG", None)
strategy = tf.distribute.MultiWorkerMirroredStrategy()  # one worker: what the handler needs
with strategy.scope():
    v = tf.Variable(1.0)
checkpoint = tf.train.Checkpoint(v=v)
handler = tf.distribute.experimental.PreemptionCheckpointHandler(
    strategy.cluster_resolver, checkpoint, sys.argv[1]
)
assert getattr(signal.getsignal(signal.SIGTERM), "__self__", None) is handler


@tf.function
def train_step():
    strategy.run(lambda: v.assign_add(1.0))


for i in range(10**6):
    handler.run(train_step)
    if i == 5:
        print("ready", flush=True)
    time.sleep(0.01)
