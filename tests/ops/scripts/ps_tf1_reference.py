"""examples/ps_tf1.py's workload (same variables and sizes) that also asks TF itself, on the
steps in REFERENCE_STEPS, for the ops it ran: FULL_TRACE RunOptions + its own RunMetadata.
Each worker writes ``{"rank", "step", "ops": [[node name, op type, device], ...]}`` lines to
REFERENCE_FILE (``{rank}`` in it becomes the worker's index), so tests compare tf_otel's op
spans with the kernels TF picked on THIS machine (``MatMul`` or oneDNN's ``_MklMatMul``, fused
or not) instead of naming op types.
"""

import json
import os

import numpy as np
import tensorflow as tf

STEPS = int(os.environ.get("STEPS", "20"))
REFERENCE_STEPS = {int(s) for s in os.environ.get("REFERENCE_STEPS", "1").split(",") if s}
tf.compat.v1.disable_eager_execution()
config = json.loads(os.environ["TF_CONFIG"])
cluster = tf.train.ClusterSpec(config["cluster"])
task, index = config["task"]["type"], int(config["task"]["index"])
REFERENCE_FILE = os.environ["REFERENCE_FILE"].format(rank=index)
server = tf.distribute.Server(cluster, job_name=task, task_index=index)
if task == "ps":
    print("ps serving", flush=True)
    server.join()

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
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)


def reported_ops(metadata):
    """(node, type, device) of every op execution TF reports (not RecvTensor transfers)."""
    ops = []
    for dev in metadata.step_stats.dev_stats:
        for node in dev.node_stats:
            if node.node_name in ("_SOURCE", "_SINK", "RecvTensor"):
                continue
            label = node.timeline_label  # "name = Type(inputs)"
            op_type = label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else "?"
            ops.append([node.node_name, op_type, dev.device])
    return ops


session_config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", device])
with (
    tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=index == 0, config=session_config
    ) as sess,
    open(REFERENCE_FILE, "w") as out,
):
    for step in range(STEPS):
        kwargs = {}
        if step in REFERENCE_STEPS:
            kwargs["options"] = tf.compat.v1.RunOptions(
                trace_level=tf.compat.v1.RunOptions.FULL_TRACE
            )
            kwargs["run_metadata"] = tf.compat.v1.RunMetadata()
        value, _ = sess.run([loss, train_op], {x: features, y: labels}, **kwargs)
        if kwargs:
            ops = reported_ops(kwargs["run_metadata"])
            out.write(json.dumps({"rank": index, "step": step, "ops": ops}) + "\n")
print(f"worker {index} done steps={STEPS} loss={value:.6f}", flush=True)
