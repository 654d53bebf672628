"""TF2 ParameterServerStrategy: one process per task from TF_CONFIG. The chief is the coordinator
(ClusterCoordinator.schedule of a small tf.function train step); ps and workers only serve.

Run 1 chief + 1 ps + 2 workers on 127.0.0.1 (tests/ops/test_ops_ps_tf2.py does):
    TF_CONFIG='{"cluster": {"chief": ["127.0.0.1:2221"], "ps": ["127.0.0.1:2222"],
      "worker": ["127.0.0.1:2223", "127.0.0.1:2224"]}, "task": {"type": "chief", "index": 0}}' \\
      python examples/ps_tf2.py
The ps and worker processes block in server.join(): end them with SIGKILL.
"""

import json
import os

import tensorflow as tf

STEPS = int(os.environ.get("STEPS", "8"))
config = json.loads(os.environ["TF_CONFIG"])
task, index = config["task"]["type"], int(config["task"]["index"])
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if task in ("ps", "worker"):
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=task, task_index=index, protocol="grpc", start=True
    )
    print(f"{task} {index} serving", flush=True)
    server.join()

strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    w = tf.Variable(tf.random.normal([32, 1], seed=1), name="w")


def dataset_fn():
    features = tf.random.stateless_normal([256, 32], seed=[1, 2])
    labels = tf.random.stateless_normal([256, 1], seed=[1, 3])
    return tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(64)


# built on each worker by a ResourceClosure (not a step)
iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))


@tf.function
def train_step(iterator):
    features, labels = next(iterator)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(features, w) - labels))
    w.assign_sub(0.01 * tape.gradient(loss, w))
    return loss


results = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(STEPS)]
coordinator.join()
print(f"chief done closures={len(results)} loss={results[-1].fetch():.6f}", flush=True)
