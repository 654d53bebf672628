"""TF1 parameter-server training: one tf.distribute.Server per task from TF_CONFIG; ps tasks
serve, workers train with replica_device_setter + MonitoredTrainingSession (worker 0 is chief).

Run one process per task, e.g. 1 ps + 2 workers on 127.0.0.1 (tests/ops/test_ops_ps.py does):
    TF_CONFIG='{"cluster": {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223",
      "127.0.0.1:2224"]}, "task": {"type": "worker", "index": 0}}' python examples/ps_tf1.py
Variables: w1 [32, 64] float32 (8192 bytes) and w2 [64, 1] (256 bytes) on the ps.
"""

import json
import os

import numpy as np
import tensorflow as tf

STEPS = int(os.environ.get("STEPS", "20"))
tf.compat.v1.disable_eager_execution()
config = json.loads(os.environ["TF_CONFIG"])
cluster = tf.train.ClusterSpec(config["cluster"])
task, index = config["task"]["type"], int(config["task"]["index"])
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

session_config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", device])
with tf.compat.v1.train.MonitoredTrainingSession(
    master=server.target, is_chief=index == 0, config=session_config
) as sess:
    for _ in range(STEPS):
        value, _ = sess.run([loss, train_op], {x: features, y: labels})
print(f"worker {index} done steps={STEPS} loss={value:.6f}", flush=True)
