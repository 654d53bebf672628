"""The process's one pipeline and its end: created by the first step, flushed once at exit.

Usage::

    from tf_otel.runtime.lifecycle import before_shutdown, current_pipeline, get_pipeline

    get_pipeline().begin_step(...)      # creates it from the environment on first use
    learn_cluster(cluster, "worker", 1)  # the program's own Server, before the first step
    learn_attempt("3f9c0a1b2d4e")       # rank 0's attempt (instrument/attempt.py), likewise
    current_pipeline()                  # the pipeline if one exists, else None (no side effect)
    with_pipeline(lambda p: p.handlers.on_rank(kind, handler))  # set up once it exists
    before_shutdown(timeline.flush)     # sources that still hold records hand them over first
    shutdown(timeout_s=5.0)             # within 5 s in all; safe to call more than once
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional

from tf_otel import config
from tf_otel.cluster.exit_deadline import Deadline
from tf_otel.health import fail_open, run_bounded
from tf_otel.runtime.steps import Pipeline

_pipeline: Optional[Pipeline] = None
_pipeline_lock = threading.Lock()
_setups: List[Callable[[Pipeline], None]] = []  # run on the pipeline when it is created
_tracer_provider: Any = None  # instrument(tracer_provider=...): else the global one
_in_process_cluster = False  # Servers of several tasks built in this process (learn_cluster)


def given_tracer_provider() -> Any:
    """The TracerProvider instrument() was given, or None (the global one)."""
    return _tracer_provider


def use_tracer_provider(provider: Any) -> None:
    """The TracerProvider the pipeline will use (before the first step), as the OpenTelemetry
    contrib instrumentations take one; None: the global provider."""
    global _tracer_provider
    _tracer_provider = provider


def get_pipeline() -> Pipeline:
    global _pipeline
    if _pipeline is None:
        with _pipeline_lock:
            if _pipeline is None:
                # created by the first step, from TensorFlow's patched calls that cannot carry
                # them: the settings instrument() read and handed to config.use()
                settings = config.current()
                from tf_otel.job.topology import detect

                pipeline = Pipeline(
                    settings,
                    detect(job_id=settings.job_id, attempt=settings.attempt),
                    _tracer_provider,
                )
                for setup in _setups:  # before any step: no message can arrive unhandled
                    with fail_open("pipeline.setup"):
                        setup(pipeline)
                _pipeline = pipeline
    return _pipeline


def learn_cluster(cluster: Any, task_type: str, task_index: int) -> bool:
    """The program built a ``tf.distribute.Server`` for task (``task_type``, ``task_index``) of
    ``cluster`` (instrument/cluster.py): where the environment names no launcher and no
    TF_CONFIG, that cluster is this process's identity (rank, world size, job id; see
    job/topology.py). Taken only before the first step: the pipeline, if it exists already, is
    re-identified while it has begun no step; after one, the process keeps the identity it
    started with (said once). A second Server of another task in the same process (an
    in-process cluster) makes the process no single task: the identity is forgotten again.
    True if the process's identity changed."""
    from tf_otel.health import log_once
    from tf_otel.job import topology

    found = topology.program_cluster(cluster, task_type, task_index)
    if found is None:
        return False
    global _in_process_cluster
    with _pipeline_lock:
        known = topology.learned_cluster()
        if known == found or _in_process_cluster:
            return False
        new: Optional[topology.ProgramCluster] = found
        if known is not None:  # several tasks' Servers in one process
            new = None
            _in_process_cluster = True
            log_once(
                "cluster:in_process",
                "tf_otel: this process built Servers for %s:%d and %s:%d of one cluster (an "
                "in-process cluster); it is traced as one process, not as a task of the cluster",
                known.task_type,
                known.task_index,
                found.task_type,
                found.task_index,
            )
        pipeline = _pipeline
        if pipeline is None or not pipeline.started:
            topology.learn_cluster(new)
            if pipeline is None:  # the usual case: get_pipeline() will detect() it
                return True
            settings = pipeline.settings
            adopted = topology.detect(job_id=settings.job_id, attempt=settings.attempt)
            if adopted.launcher not in (topology.TF_SERVER, "none"):
                return False  # the launcher's environment or TF_CONFIG identify the process
            if pipeline.adopt(adopted):
                return True
            topology.learn_cluster(known)  # a step began meanwhile: keep what it started with
        log_once(
            "cluster:after_first_step",
            "tf_otel: the program built its tf.distribute.Server (task %s:%d) after its first "
            "traced step; this process keeps rank %d of %d and job id %s. Create the Server "
            "before the first Session.run, or set TF_CONFIG, so its steps join the other tasks'",
            found.task_type,
            found.task_index,
            pipeline.topology.rank,
            pipeline.topology.world_size,
            pipeline.job_id,
        )
        return False


def learn_attempt(attempt: str) -> bool:
    """Every worker of this launch learned ``attempt`` from rank 0 (instrument/attempt.py): the
    process's step trace ids are this attempt's where its topology takes one (job/topology.py,
    ``launch_attempt``). Taken only before the first step, as ``learn_cluster``: a pipeline that
    has begun a step keeps the ids it started with (said once). True if the process's attempt
    changed."""
    from tf_otel.health import log_once
    from tf_otel.job import topology

    with _pipeline_lock:
        known = topology.learned_attempt()
        if not attempt or known == attempt:
            return False
        topology.learn_attempt(attempt)
        pipeline = _pipeline
        if pipeline is None:  # the usual case: get_pipeline() will detect() it
            return True
        if not pipeline.started:
            settings = pipeline.settings
            adopted = topology.detect(job_id=settings.job_id, attempt=settings.attempt)
            if adopted.attempt == pipeline.topology.attempt:
                return False  # the environment or a setting decides this process's attempt
            if pipeline.adopt(adopted):
                return True
        topology.learn_attempt(known)  # a step began: keep what it started with
        log_once(
            "attempt:after_first_step",
            "tf_otel: this launch's attempt %s came after this process's first traced step; its "
            "step trace ids stay the job's alone (%s). Create the MultiWorkerMirroredStrategy "
            "before the first step, or set TF_OTEL_ATTEMPT",
            attempt,
            pipeline.trace_scope,
        )
        return False


def with_pipeline(setup: Callable[[Pipeline], None]) -> None:
    """Run ``setup(pipeline)`` on this process's pipeline: now if it exists, else when
    ``get_pipeline`` creates it (sources register their message handlers this way, at
    instrument time, without creating the pipeline early)."""
    with _pipeline_lock:
        pipeline = _pipeline
        if pipeline is None:
            _setups.append(setup)
            return
    with fail_open("pipeline.setup"):
        setup(pipeline)


_before_shutdown: List[Any] = []


def current_pipeline() -> Optional[Pipeline]:
    """This process's pipeline, or None before the first step (never creates one)."""
    return _pipeline


def before_shutdown(callback: Any) -> None:
    """Run ``callback()`` at the start of shutdown (exit, SIGTERM), before spans are flushed:
    sources that still hold records (e.g. the Horovod timeline) hand them over there."""
    if callback not in _before_shutdown:
        _before_shutdown.append(callback)


_shutdown_lock = threading.Lock()


_exit_reported = False


def shutdown(timeout_s: Optional[float] = None) -> None:
    """Flush this process's step spans, then say in one line what was lost, if anything; within
    timeout_s in all (default TF_OTEL_EXIT_TIMEOUT_S): every stage takes what the ones before it
    left. Safe to call more than once."""
    global _exit_reported
    # atexit passes TF_OTEL_EXIT_TIMEOUT_S (signals.py); a program's own call may not
    limit_s = config.current().exit_timeout_s if timeout_s is None else timeout_s
    deadline = Deadline(limit_s)
    with _shutdown_lock:
        for callback in list(_before_shutdown):
            with fail_open("shutdown.before"):
                callback()
        first = not _exit_reported
        _exit_reported = True
        delivered = False

        def deliver(left_s: float) -> None:
            """The spans' flush, then (the first time) the loss line and the final counts:
            before the stages that only wait (the link to rank 0, clock, metrics providers)."""
            nonlocal delivered
            delivered = True
            with fail_open("shutdown.provider"):
                from opentelemetry import trace

                from tf_otel.otel.sdk import bounded_flush

                bounded_flush(trace.get_tracer_provider(), left_s)
            if first:
                _report_at_exit(limit_s, deadline)

        pipeline = _pipeline
        if pipeline is not None:
            with fail_open("shutdown"):
                pipeline.shutdown(deadline.left(), deliver)
        if not delivered:  # no pipeline (no step ran), or it failed before its flush
            deliver(deadline.left())
        if first:
            with fail_open("shutdown.meter_provider"):
                _stop_own_meter_provider(deadline.left(2.0))


def _report_at_exit(limit_s: float, deadline: Deadline) -> None:
    """The exit's one line of what was lost (naming the limit), and the final counts as
    metrics, never holding the exit."""
    with fail_open("shutdown.report"):
        from tf_otel.otel import delivery

        delivery.report_at_exit(limit_s)
    with fail_open("shutdown.metrics"):
        from tf_otel.metrics import health_metrics

        flush_s = deadline.left(2.0)
        run_bounded("tf_otel-metrics-flush", flush_s, health_metrics.flush, flush_s)


def _stop_own_meter_provider(timeout_s: float) -> None:
    """The MeterProvider tf_otel configured ends on a daemon thread joined for a bounded time:
    its own atexit handler would wait up to 30 s on an exporter retrying a missing or hanging
    collector. A provider the program (or opentelemetry-instrument) set up is left to its owner."""
    from tf_otel.otel import sdk

    if not sdk.configured_here():
        return
    from opentelemetry import metrics

    provider = metrics.get_meter_provider()
    handler = getattr(provider, "_atexit_handler", None)  # SDK internals (1.45)
    if handler is None or not hasattr(provider, "shutdown"):
        return
    import atexit

    atexit.unregister(handler)
    provider._atexit_handler = None  # type: ignore[attr-defined]
    run_bounded(
        "tf_otel-metrics-stop", timeout_s, provider.shutdown, timeout_millis=timeout_s * 1000
    )
