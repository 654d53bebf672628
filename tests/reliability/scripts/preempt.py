"""A training loop that checkpoints in its own SIGTERM handler (the preemption pattern).

Env: HANDLER=after (install the handler after TF and tf_otel are set up, the usual case) or
before (install it first, then ``tf_otel.instrument()`` in code); SELF_SIGNAL_AT=N sends this
process SIGTERM at step N (as a scheduler would); CKPT_DIR: where the checkpoint goes.
HVD=1: under horovodrun. Prints "ready" once training runs, "checkpoint written" and
"exit clean" at the end.
"""

import os
import signal
import sys
import time

preempted = False


def on_sigterm(signum, frame):
    global preempted
    preempted = True  # finish the current step, checkpoint, then exit 0


if os.environ.get("HANDLER") == "before":
    signal.signal(signal.SIGTERM, on_sigterm)
    import tf_otel

    tf_otel.instrument()

import tensorflow as tf  # noqa: E402

rank = 0
if os.environ.get("HVD") == "1":
    import horovod.tensorflow as hvd

    hvd.init()
    rank = hvd.rank()

if os.environ.get("HANDLER") != "before":
    signal.signal(signal.SIGTERM, on_sigterm)
assert signal.getsignal(signal.SIGTERM) is on_sigterm, "the program's handler was replaced"

v = tf.Variable(1.0)
ckpt = tf.train.Checkpoint(v=v)


@tf.function
def train_step():
    v.assign_add(1.0)
    return v


signal_at = int(os.environ.get("SELF_SIGNAL_AT", "-1"))
step = 0
while True:
    train_step()
    step += 1
    if step == 5:
        print("ready", flush=True)
    if step == signal_at:
        os.kill(os.getpid(), signal.SIGTERM)
    if preempted:
        # what a real job does here takes a while (finish the step, agree, write): longer than any
        # grace period plus flush a tracer might give itself
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            train_step()
            step += 1
        path = ckpt.write(os.path.join(os.environ["CKPT_DIR"], f"ckpt-rank{rank}"))
        print("checkpoint written", path, flush=True)
        break
    time.sleep(0.01)
print("exit clean", flush=True)
sys.exit(0)
