"""Job identity from what the program itself says: the cluster it gives its own
``tf.distribute.Server`` (= ``tf.compat.v1.train.Server``).

A TF1 parameter-server program given its cluster by flags builds the server itself, with no
``TF_CONFIG`` and no launcher, e.g. tensorflow/benchmarks' tf_cnn_benchmarks::

    python tf_cnn_benchmarks.py --job_name=worker --task_index=1 \\
        --ps_hosts=h0:2222 --worker_hosts=h1:2222,h2:2222 --variable_update=parameter_server

    cluster = tf.train.ClusterSpec({"ps": ps_hosts, "worker": worker_hosts})
    server = tf.distribute.Server(cluster, job_name="worker", task_index=1)  # <- learned here

Once ``Server.__init__`` has returned, its ``ServerDef`` (cluster, job name, task index, however
the server was given them: ClusterSpec, dict, ClusterDef or ServerDef) goes to
``runtime.lifecycle.learn_cluster``: where the environment names no launcher and no TF_CONFIG,
it gives the process its rank, world size and job id exactly as the same cluster in TF_CONFIG
would (job/topology.py), so both workers' steps share one trace per step and rank 0 (chief,
else worker 0) hosts the coordinator. A cluster of one task (``create_local_server``) is no
identity. A server built after the first traced step changes nothing (said once). A
MultiWorkerMirroredStrategy given a cluster resolver in code builds no ``Server``: its cluster
is learned the same way when the strategy joins it (``learn_from_strategy``, called by
instrument/attempt.py's hook on that join).
"""

from __future__ import annotations

from typing import Any, Callable, Dict

from tf_otel.config import Settings
from tf_otel.health import fail_open
from tf_otel.instrument._patching import when_imported, wrap


def cluster_of(cluster_def: Any) -> Dict[str, Dict[int, str]]:
    """A ``tf.train.ClusterDef`` as job name -> {task index: address}."""
    return {
        str(job.name): {int(index): str(address) for index, address in job.tasks.items()}
        for job in cluster_def.job
    }


def learn_from_server(server: Any) -> bool:
    """Tell the pipeline which task of which cluster this server is; True if that changed the
    process's identity."""
    from tf_otel.runtime.lifecycle import learn_cluster

    server_def = server.server_def
    return learn_cluster(
        cluster_of(server_def.cluster), str(server_def.job_name), int(server_def.task_index)
    )


def learn_from_strategy(extended: Any) -> bool:
    """The same for a MultiWorkerMirroredStrategy given its cluster in code (a cluster resolver
    and no TF_CONFIG): its extended object just joined that cluster (``_cluster_spec``,
    ``_task_type``, ``_task_id``); True if that changed the process's identity."""
    from tf_otel.runtime.lifecycle import learn_cluster

    spec = getattr(extended, "_cluster_spec", None)
    task_type, task_id = getattr(extended, "_task_type", None), getattr(extended, "_task_id", None)
    if spec is None or task_type is None or task_id is None:
        return False
    return learn_cluster(cluster_of(spec.as_cluster_def()), str(task_type), int(task_id))


def _server_init_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    with fail_open("cluster.server"):
        learn_from_server(instance)
    return result


def _patch(module: Any) -> None:
    wrap(module.Server, "__init__", _server_init_wrapper)


def register(settings: Settings) -> None:
    when_imported("tensorflow.python.training.server_lib", _patch)
