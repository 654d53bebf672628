"""A TF1 parameter-server task given its role by command-line flags only, the way
tensorflow/benchmarks' tf_cnn_benchmarks is run (no TF_CONFIG, no launcher)::

    python ps_tf1_flags.py --job_name=worker --task_index=1 \\
        --ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2223,127.0.0.1:2224 \\
        --steps=6 --sync_dir=/tmp/run

It builds its ``tf.train.ClusterSpec`` and ``tf.compat.v1.train.Server`` itself. Between-graph
replication: variables on the ps (replica_device_setter), worker 0 initialises them, every
worker runs ``--steps`` training ``Session.run`` calls. The workers meet in ``--sync_dir``
(files, no Session.run) before their first step and after their last, so their steps overlap,
and once more after worker 1 has flushed tf_otel, so worker 0 (rank 0, the coordinator) has
every extent of worker 1 before it ends. Each task prints the
identity tf_otel took once its Server exists (``identity {...}``); a ps serves until killed.
"""

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--job_name", required=True)
parser.add_argument("--task_index", type=int, required=True)
parser.add_argument("--ps_hosts", required=True)
parser.add_argument("--worker_hosts", required=True)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--sync_dir", required=True)
flags = parser.parse_args()
assert "TF_CONFIG" not in os.environ

tf.compat.v1.disable_eager_execution()
workers = flags.worker_hosts.split(",")
cluster = tf.train.ClusterSpec({"ps": flags.ps_hosts.split(","), "worker": workers})
server = tf.compat.v1.train.Server(cluster, job_name=flags.job_name, task_index=flags.task_index)

from tf_otel.job.topology import detect  # noqa: E402 - what tf_otel took, after the Server

me = detect()
print("identity " + json.dumps({k: getattr(me, k) for k in (
    "rank", "world_size", "job_id", "launcher", "task", "stepping_ranks", "reference_host"
)}), flush=True)  # fmt: skip
if flags.job_name == "ps":
    server.join()

sync = Path(flags.sync_dir)


def meet(name: str, timeout_s: float = 120.0) -> None:
    """Wait until every worker has written ``name-<index>`` (plain files: no Session.run)."""
    (sync / f"{name}-{flags.task_index}").touch()
    deadline = time.monotonic() + timeout_s
    while not all((sync / f"{name}-{i}").exists() for i in range(len(workers))):
        if time.monotonic() > deadline:
            raise SystemExit(f"worker {flags.task_index}: nobody met at {name}")
        time.sleep(0.05)


index = flags.task_index
rng = np.random.default_rng(index)
features = rng.normal(size=(64, 32)).astype("float32")
labels = rng.normal(size=(64, 1)).astype("float32")
device = f"/job:worker/task:{index}"
setter = tf.compat.v1.train.replica_device_setter(worker_device=device, cluster=cluster)
with tf.compat.v1.device(setter):
    x = tf.compat.v1.placeholder(tf.float32, [None, 32])
    y = tf.compat.v1.placeholder(tf.float32, [None, 1])
    w1 = tf.compat.v1.get_variable("w1", [32, 64])
    w2 = tf.compat.v1.get_variable("w2", [64, 1])
    loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2) - y))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
    init = tf.compat.v1.global_variables_initializer()

session_config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", device])
with tf.compat.v1.Session(server.target, config=session_config) as sess:
    if index == 0:
        sess.run(init)  # an initialisation run: not a step
        (sync / "initialised").touch()
    while not (sync / "initialised").exists():
        time.sleep(0.05)
    meet("start")
    for _ in range(flags.steps):
        value, _ = sess.run([loss, train_op], {x: features, y: labels})
    meet("end")
if index != 0:  # its last steps' extents reach rank 0 before rank 0 ends and emits the roots
    from tf_otel.runtime import lifecycle  # noqa: E402

    lifecycle.shutdown()
meet("flushed")
print(f"worker {index} done steps={flags.steps} loss={value:.6f}", flush=True)
