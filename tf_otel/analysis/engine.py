"""Where ``tf-otel analyze`` runs its independent pieces of work: in this process or on Dask.

Usage::

    with open_engine(workers=None, scheduler=None, input_bytes=size) as engine:
        for answer in engine.map(function, items):   # answers in the items' order
            ...

- ``InProcess``: one process. Chosen with one usable CPU (``TF_OTEL_ANALYZE_WORKERS=1``), for
  inputs below ``LOCAL_CLUSTER_MIN_BYTES`` (starting worker processes costs seconds), and where
  Dask is not installed (``pip install tf-otel[analysis]``; one line on stderr says so).
- ``DaskEngine``: ``dask.distributed``. Without a scheduler address an embedded
  ``LocalCluster`` (one single-threaded worker process per usable CPU, no dashboard), removed
  when the analysis ends; with one (``--scheduler``, ``TF_OTEL_ANALYZE_SCHEDULER``), that
  cluster, e.g. one started on a SLURM or PBS allocation by ``dask-jobqueue``. The workers
  read the spilled spans: on a cluster the spill directory (``--spill-dir``) must be on a
  filesystem every worker sees.

The functions and items sent must be picklable and must not need this process's state: the
pieces are whole files (decoding), batches of traces (building steps) and batches of steps
(analysing them), each with what it reads. Why Dask and not Ray: docs/guides/ANALYSIS.md.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from typing import Any, Callable, Deque, Iterable, Iterator, Optional, Protocol, TypeVar

from tf_otel.analysis.errors import AnalysisError

T = TypeVar("T")
R = TypeVar("R")

LOCAL_CLUSTER_MIN_BYTES = 256 << 20  # below this, one process beats starting a cluster
WORKERS_ENV = "TF_OTEL_ANALYZE_WORKERS"  # worker processes; 1: this process only
CONNECT_TIMEOUT = "10s"  # a scheduler that does not answer by then is reported
IN_FLIGHT_PER_WORKER = 4  # pieces sent ahead of the answers read: keeps every worker busy
_DONE = object()


class Engine(Protocol):
    workers: int

    def map(self, function: Callable[[T], R], items: Iterable[T]) -> Iterator[R]: ...

    def close(self) -> None: ...


class InProcess:
    workers = 1

    def map(self, function: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        for item in items:
            yield function(item)

    def close(self) -> None:
        pass


class DaskEngine:
    """A ``dask.distributed`` client: on an embedded local cluster or on ``scheduler``."""

    def __init__(self, workers: int, scheduler: Optional[str] = None) -> None:
        import dask
        from dask.distributed import Client, LocalCluster

        self._cluster: Any = None
        try:
            if scheduler:
                self._client = Client(scheduler, timeout=CONNECT_TIMEOUT)
            else:
                with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
                    self._cluster = LocalCluster(
                        n_workers=workers,
                        threads_per_worker=1,  # the work is pure Python: one per process
                        processes=True,
                        host="127.0.0.1",  # this machine only
                        dashboard_address="127.0.0.1:0",  # its HTTP server on a free port
                        silence_logs=50,  # the report is the output (a closing race logs)
                    )
                self._client = Client(self._cluster)
        except OSError as error:
            self.close()
            raise AnalysisError(f"dask scheduler {scheduler or 'local'}: {error}") from None
        self.workers = max(1, len(self._client.scheduler_info().get("workers", {})) or workers)

    def map(self, function: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """``function`` over ``items`` on the workers, answers in order; at most
        ``IN_FLIGHT_PER_WORKER`` pieces a worker are sent ahead, so neither the pieces nor the
        answers pile up in this process."""
        from distributed.scheduler import KilledWorker

        pending: Deque[Any] = deque()
        source = iter(items)
        ahead = IN_FLIGHT_PER_WORKER * self.workers
        try:
            while True:
                while len(pending) < ahead:
                    item = next(source, _DONE)
                    if item is _DONE:
                        break
                    pending.append(self._client.submit(function, item, pure=False))
                if not pending:
                    return
                future = pending.popleft()
                try:
                    answer = future.result()
                except KilledWorker:
                    raise AnalysisError(
                        f"a worker process died (out of memory?); {WORKERS_ENV}=1 analyses "
                        "in this process"
                    ) from None
                future.release()
                yield answer
        finally:
            for future in pending:
                future.cancel()

    def close(self) -> None:
        client, cluster = getattr(self, "_client", None), self._cluster
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()


class _Opened:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __enter__(self) -> Engine:
        return self.engine

    def __exit__(self, *exc: object) -> None:
        self.engine.close()


def engine_workers(requested: int, scheduler: Optional[str], input_bytes: int) -> int:
    """The worker processes ``open_engine`` plans for (1: this process)."""
    if scheduler:
        return max(1, requested or usable_cpus())
    workers = requested or usable_cpus()
    if workers <= 1 or (not requested and input_bytes < LOCAL_CLUSTER_MIN_BYTES):
        return 1
    return workers


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def open_engine(requested: int, scheduler: Optional[str] = None, input_bytes: int = 0) -> _Opened:
    """The engine for ``requested`` workers (0: automatic) and an input of ``input_bytes``:
    this process for one worker, or automatically for a small input; else Dask."""
    workers = engine_workers(requested, scheduler, input_bytes)
    if workers <= 1 and not scheduler:
        return _Opened(InProcess())
    try:
        import dask.distributed  # noqa: F401
    except ImportError:
        if scheduler:
            raise AnalysisError(
                f"--scheduler {scheduler}: dask is not installed (pip install 'tf-otel[analysis]')"
            ) from None
        print(
            "tf-otel: dask is not installed: analysing in one process "
            "(pip install 'tf-otel[analysis]' uses every CPU)",
            file=sys.stderr,
        )
        return _Opened(InProcess())
    return _Opened(DaskEngine(workers, scheduler))
