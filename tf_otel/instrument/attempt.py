"""One attempt id for every worker of a MultiWorkerMirroredStrategy launch, handed out by rank 0
through TensorFlow's coordination service (job/topology.py, ``launch_attempt``).

A job of several ranks identified by TF_CONFIG alone (a Kubernetes TFJob, workers started by
hand) has the same job id on every run, so step n of a rerun would get the trace id of step n of
the run before. Creating the strategy is a rendezvous of every worker before any step, after
which the coordination service's key-value store belongs to this launch alone: rank 0 puts a
random attempt under ``KEY`` and every other worker reads it back, waiting at most ``WAIT_S``
inside the strategy's creation, never on a step. The attempt reaches the topology through
``runtime.lifecycle.learn_attempt`` before the first step. Only the attempt id crosses the
store.

Nothing is exchanged where TF_OTEL_ATTEMPT or TF_OTEL_JOB_ID is set, a launcher decides the
attempt, the job has one worker, this task is not the one tf_otel knows (from TF_CONFIG or the
program's cluster resolver, instrument/cluster.py) or not in the service, or the strategy
started no coordination service. A failure leaves this worker without an attempt (said once):
its step ids are the job's alone. A rank 0 whose steps began before the strategy hands out
"none". ParameterServerStrategy is not covered (its chief is not in the service): set
TF_OTEL_ATTEMPT there, docs/guides/RELIABILITY.md.

Usage::

    from tf_otel.instrument import attempt
    attempt.register(settings)   # a post-import hook; nothing is imported here
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Optional

from tf_otel.config import Settings
from tf_otel.health import count, fail_open, log_once
from tf_otel.instrument import cluster
from tf_otel.instrument._patching import when_imported, wrap

KEY = "tf_otel/attempt"
WAIT_S = 30.0  # a worker waits this long for rank 0's value, once, while the strategy is created
COORDINATED = ("chief", "worker")  # the tasks MultiWorkerMirroredStrategy's service coordinates
_STRATEGY = "tensorflow.python.distribute.collective_all_reduce_strategy"


def _writer_or_reader(extended: Any, settings: Settings) -> Optional[bool]:
    """True: this process hands the attempt out (rank 0); False: it reads it; None: no exchange
    (module docstring), decided alike on every worker from the same facts."""
    from tf_otel.job import topology

    if settings.attempt or settings.job_id:
        return None
    cluster = getattr(extended, "_cluster_spec", None)
    task_type, task_id = getattr(extended, "_task_type", None), getattr(extended, "_task_id", None)
    if cluster is None or task_type not in COORDINATED or task_id is None:
        return None
    topo = topology.detect()
    by_spec = topo.launcher in ("tf_config", topology.TF_SERVER)
    if topo.attempt or topo.world_size <= 1 or not by_spec:
        return None
    mine = topology.cluster_topology(cluster.as_dict(), task_type, int(task_id), topo.host)
    if (mine.job_id, mine.rank, mine.world_size) != (topo.job_id, topo.rank, topo.world_size):
        return None  # the strategy's cluster is not the one this process is traced as
    if topology.rank0_task(cluster.as_dict())[0] not in COORDINATED:
        log_once(
            "attempt:rank0_outside",
            "tf_otel: rank 0 of this cluster is not a chief or worker task (not in TensorFlow's "
            "coordination service): no attempt id is handed out; set TF_OTEL_ATTEMPT",
        )
        return None
    return topo.is_reference


def exchange(offer: Optional[str], wait_s: float = WAIT_S) -> str:
    """Rank 0 puts ``offer`` (a new attempt id; "": none, its steps began before the strategy)
    in the coordination service's key-value store, the others (``offer`` None) read it there,
    waiting at most ``wait_s``: the value. Raises what TensorFlow raises (no service, a
    timeout)."""
    from tensorflow.python.eager import context

    ctx = context.context()
    service = ctx.coordination_service
    if service is None or not service.service_type:
        raise RuntimeError("no coordination service")
    if offer is None:
        return str(ctx.get_config_key_value(KEY, int(wait_s * 1000)))
    try:
        ctx.set_config_key_value(KEY, offer)
    except Exception:  # noqa: BLE001 - there already (an earlier strategy's): that one's
        return str(ctx.get_config_key_value(KEY, 1000))
    return offer


_tried = False  # one exchange a process: a later strategy is the same launch


def share_attempt(extended: Any, settings: Settings) -> Optional[str]:
    """The exchange for a ``CollectiveAllReduceExtended`` just joined to its cluster, its
    attempt handed to the pipeline; None where there is none (module docstring)."""
    from tf_otel.runtime import lifecycle

    global _tried
    if _tried:
        return None
    writer = _writer_or_reader(extended, settings)
    if writer is None:
        return None
    _tried = True
    pipeline = lifecycle.current_pipeline()
    offer = None
    if writer:  # a rank 0 whose steps began keeps the job's ids: so do the others, unkept waiting
        offer = "" if pipeline is not None and pipeline.started else uuid.uuid4().hex[:12]
    try:
        found = exchange(offer)
    except Exception as exc:  # noqa: BLE001 - never into the program's strategy creation
        count("attempt.exchange_failed")
        log_once(
            "attempt:exchange",
            "tf_otel: no attempt id from TensorFlow's coordination service (%s: %s); this "
            "launch's step trace ids are the job's alone and may repeat a run before it "
            "(set TF_OTEL_ATTEMPT to tell launches apart)",
            type(exc).__name__,
            str(exc).splitlines()[0][:200] if str(exc) else "",
        )
        return None
    if not found:
        log_once(
            "attempt:rank0_started",
            "tf_otel: rank 0 traced steps before it created the MultiWorkerMirroredStrategy: "
            "this launch has no attempt id, its step trace ids are the job's alone (set "
            "TF_OTEL_ATTEMPT to tell launches apart)",
        )
        return None
    lifecycle.learn_attempt(found)
    return found


def register(settings: Settings) -> None:
    """A post-import hook (idempotent)."""

    def joined(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        out = wrapped(*args, **kwargs)
        with fail_open("cluster.strategy"):  # a cluster given in code: the job's identity
            cluster.learn_from_strategy(instance)
        with fail_open("attempt.share"):
            share_attempt(instance, settings)
        return out

    def patch(module: Any) -> None:
        # its __init__ calls this for a cluster of several tasks (tf_collectives wraps __init__)
        wrap(module.CollectiveAllReduceExtended, "_initialize_multi_worker", joined)

    when_imported(_STRATEGY, patch)
