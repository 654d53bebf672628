"""A tiny Keras ``fit`` under ``BackupAndRestore``: EPOCHS epochs of BATCHES batches, backed up
in BACKUP_DIR at each epoch's end. With INTERRUPT_EPOCH set, a callback raises at the start of
that epoch (as Keras' own tests interrupt a fit) and the process exits 3; run again without it,
the fit resumes from the last backup in a fresh process.

Env: BACKUP_DIR, EPOCHS (6), BATCHES (4), INTERRUPT_EPOCH (-1: none), RESTORE (1; 0: no
BackupAndRestore callback). Prints "epochs run: [...]" and "iterations N" at the end.
"""

import os
import sys

import numpy as np
import tensorflow as tf

EPOCHS = int(os.environ.get("EPOCHS", "6"))
BATCHES = int(os.environ.get("BATCHES", "4"))
INTERRUPT_EPOCH = int(os.environ.get("INTERRUPT_EPOCH", "-1"))
keras = tf.keras


class Interrupt(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == INTERRUPT_EPOCH:
            raise RuntimeError(f"interrupted at epoch {epoch}")


class Epochs(keras.callbacks.Callback):
    seen = []

    def on_epoch_begin(self, epoch, logs=None):
        self.seen.append(epoch)


rng = np.random.default_rng(0)
x = rng.normal(size=(8 * BATCHES, 4)).astype("float32")
y = rng.normal(size=(8 * BATCHES, 1)).astype("float32")
model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
model.compile(keras.optimizers.SGD(0.01), loss="mse")
callbacks = [Epochs(), Interrupt()]
if os.environ.get("RESTORE", "1") == "1":
    callbacks.insert(0, keras.callbacks.BackupAndRestore(backup_dir=os.environ["BACKUP_DIR"]))
try:
    model.fit(x, y, batch_size=8, epochs=EPOCHS, verbose=0, callbacks=callbacks)
except RuntimeError as exc:
    print(f"{exc}; epochs run: {Epochs.seen}", flush=True)
    sys.exit(3)
print(f"epochs run: {Epochs.seen}", flush=True)
print(f"iterations {int(model.optimizer.iterations.numpy())}", flush=True)
