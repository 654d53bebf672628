"""Horovod collectives in TF1 graphs (``Session.run``) timed by every rank itself: timing ops
that run only when a detail step fetches them.

Usage (by ``stamps``; nothing here is called by the program)::

    from tf_otel.instrument.horovod import graph_stamps
    out = graph_stamps.around_op(tf, wrapped, args, kwargs, op, grouped)      # MPI_LIB op
    out = graph_stamps.around_cond(tf, wrapped, args, kwargs, op, grouped)    # Horovod's cond
    graph_stamps.step_begins(detail)                  # a Session.run step's start
    wrap(BaseSession, "_do_run", graph_stamps.around_run)  # each run the step makes
    found, unprepared = graph_stamps.step_ends()      # its end: [(Stamp, t0_ns, t1_ns, group)]

A TF1 graph runs only what a run fetches. Where the program builds a Horovod op in a plain TF1
graph, the graph gets ``stack([timestamp after the op's inputs, timestamp after its outputs])``,
which nothing depends on: a run that does not fetch it never runs it (steps without detail run
the program's graph as it would, no standing cost). On a collective-detail step each run the
step makes (``BaseSession._do_run``, below MonitoredSession's hooks, so the fetches are the
run's own) fetches, beside its fetches, the stamps of the collectives they depend on (found by
walking the graph backwards), so a run never executes a collective it would not have run.

A run with new fetches makes TensorFlow build an executor for it (0.95 s on MobileNetV2's graph).
So no detail step pays for that, every run a step makes is prepared ahead on the twin thread
(detail_twin.prepare_later, paced, at low priority): its stamps found and the run with them
built, not run. Picked steps wait for it on every rank as for a twin; a run of a detail step
that is not prepared yet goes without stamps and the step says so (``preparing``).

Horovod's ``DistributedOptimizer`` builds each collective inside a ``tf.cond`` whose branches are
functions (control flow v2) or a v1 cond context: neither can be fetched from. There the stamps
go around the cond (``_allreduce_cond``), outside it, and the op inside only names the tensors.
The arrival stamp is not a control input of the op (that would run it on every step): it runs
when the inputs are ready, as the op does, so an executor with every thread busy may take it a
little late (docs/guides/HOROVOD.md, limits).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from tf_otel.health import count, fail_open, report_failure
from tf_otel.instrument import detail_twin
from tf_otel.sources import horovod_stamp_records as hs

_MAX_ENTRIES = 20_000  # stamped collectives per graph
_MAX_WALK = 500_000  # ops visited finding what a run depends on


@dataclass(slots=True)
class Entry:
    """One collective's stamps in a graph: the [t0, t1] tensor, the op its run needs, names."""

    pair: Any
    op_name: str
    stamps: List[hs.Stamp]
    group: Optional[str]


class _Capture(threading.local):
    names: Optional[List[Tuple[List[hs.Stamp], Optional[str]]]] = None  # inside Horovod's cond


_capture = _Capture()
_graphs: weakref.WeakKeyDictionary[Any, List[Entry]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def plain_graph(tf: Any) -> bool:
    """Is the default graph a TF1 graph whose tensors a run can fetch (no function body)?"""
    graph = tf.compat.v1.get_default_graph()
    return not getattr(graph, "building_function", False)


def _register(graph: Any, entry: Entry) -> None:
    with _lock:
        entries = _graphs.setdefault(graph, [])
        if len(entries) >= _MAX_ENTRIES:
            count("horovod_graph_stamps_full")
            return
        entries.append(entry)
        _runs.pop(graph, None)  # new stamps: every run is prepared again


def _stamped(tf: Any, inputs: List[Any], call: Callable[[], Any]) -> Tuple[Any, Any]:
    with tf.control_dependencies(inputs):
        arrival = tf.timestamp()
    out = call()
    with tf.control_dependencies(tf.nest.flatten(out)):
        end = tf.timestamp()
    return out, tf.stack([arrival, end])


def around_op(
    tf: Any,
    wrapped: Callable,
    args: tuple,
    kwargs: dict,
    naming: Callable[[Any], Tuple[List[hs.Stamp], Optional[str]]],
    grouped: bool,
) -> Any:
    """A Horovod op built in a TF1 graph: stamped where fetchable, named inside Horovod's cond."""
    if _capture.names is not None:  # inside around_cond: the cond is stamped, not the op
        out = wrapped(*args, **kwargs)
        with fail_open("horovod.graph_stamp"):
            _capture.names.append(naming(out))
        return out
    if not plain_graph(tf) or _in_v1_context(tf):
        count("horovod_graph_stamps_unfetchable")
        return wrapped(*args, **kwargs)
    inputs = list(args[0]) if grouped else [args[0]]
    out, pair = _stamped(tf, inputs, lambda: wrapped(*args, **kwargs))
    with fail_open("horovod.graph_stamp"):
        stamps, group = naming(out)
        first = tf.nest.flatten(out)[0]
        _register(first.graph, Entry(pair, first.op.name, stamps, group))
    return out


def around_cond(tf: Any, wrapped: Callable, args: tuple, kwargs: dict, grouped: bool) -> Any:
    """Horovod's ``_allreduce_cond`` / ``_grouped_allreduce_cond`` in a TF1 graph: the stamps
    around the cond, with the names the op inside it reports."""
    if _capture.names is not None or not plain_graph(tf) or _in_v1_context(tf):
        return wrapped(*args, **kwargs)
    names: List[Tuple[List[hs.Stamp], Optional[str]]] = []
    _capture.names = names
    try:
        inputs = list(args[0]) if grouped else [args[0]]
        out, pair = _stamped(tf, inputs, lambda: wrapped(*args, **kwargs))
    finally:
        _capture.names = None
    with fail_open("horovod.graph_stamp"):
        if len(names) == 1:
            stamps, group = names[0]
            first = tf.nest.flatten(out)[0]
            _register(first.graph, Entry(pair, first.op.name, stamps, group))
    return out


def _in_v1_context(tf: Any) -> bool:
    """Inside a v1 cond / while context, whose tensors a run cannot fetch from outside."""
    graph = tf.compat.v1.get_default_graph()
    return getattr(graph, "_get_control_flow_context", lambda: None)() is not None


# -- the runs (training thread) ------------------------------------------------------------------
# A run's executor is built by TensorFlow on the first run of each (feeds, fetches, targets): a
# detail step that fetched its stamps for the first time built one on the training thread (0.95 s
# for MobileNetV2's graph). Each run a step makes is prepared instead on the twin thread: the
# stamps it needs are found there, and the run with them is built there without running it (a
# run with an invalid inter-op pool: TensorFlow builds and caches the executor, then refuses).

_QUEUED = "queued"  # a run queued for preparation, not prepared yet
_ON_STEP = "on step"  # a run that cannot be prepared ahead: its detail steps build it


@dataclass(frozen=True)
class _Ready:
    """A run prepared ahead: the stamps it fetches, and its generation (detail_twin.is_open)."""

    entries: List[Entry]
    generation: int


class _Step(threading.local):
    inside = False  # a Session.run step is under way on this thread
    detail = False  # ... and it is a detail step
    every_step = False  # every step is a detail step: unprepared runs are built on their step
    found: List[Tuple[hs.Stamp, int, int, Optional[str]]]
    unprepared = False  # a run of this detail step was not prepared yet: it ran without stamps
    stamped = False  # a run of this detail step fetched stamps


_step = _Step()
# per graph: a run's key -> _Ready (prepared), _QUEUED or _ON_STEP
_runs: weakref.WeakKeyDictionary[Any, Dict[tuple, Any]] = weakref.WeakKeyDictionary()
_MAX_RUNS = 256  # run keys per graph
_REFUSAL = "inter_op_thread_pool"
_INVALID_POOL = -2  # below -1: TensorFlow refuses the run after building its executor
_ahead = [True]  # False once a refused run ran (never seen): nothing more is built ahead


def step_begins(detail: bool, every_step: bool = False) -> None:
    """A Session.run step starts on this thread (a detail step or not)."""
    _step.inside = True
    _step.detail = detail
    _step.every_step = detail and every_step
    _step.found = []
    _step.unprepared = _step.stamped = False


def step_ends() -> Tuple[Optional[List[Tuple[hs.Stamp, int, int, Optional[str]]]], bool]:
    """The step's end: its runs' stamps (None where no run fetched any) and whether a run of it
    was not prepared yet (then it fetched none)."""
    found = _step.found if _step.stamped else None
    unprepared = _step.detail and _step.unprepared and not _step.stamped
    _step.inside = _step.detail = _step.every_step = False
    _step.found = []
    return found, unprepared


def _run_key(targets: List[Any], fetches: List[Any], feeds: Dict[Any, Any]) -> tuple:
    # the graph keeps its ops and tensors alive, so their ids name them while the graph lives
    return (tuple(map(id, fetches)), tuple(map(id, targets)), tuple(id(r.deref()) for r in feeds))


def around_run(wrapped: Callable, session: Any, args: tuple, kwargs: dict) -> Any:
    """``BaseSession._do_run`` (every run, after TensorFlow has resolved fetches and feeds):
    on a detail step, the stamps the run needs are fetched too and their values kept; any new
    run a step makes is queued for preparation."""
    if not _step.inside or not _graphs or len(args) < 4 or args[0] is not None:
        return wrapped(*args, **kwargs)  # not a step's, nothing stamped, or a partial run
    graph = getattr(session, "graph", None)
    if graph is None or graph not in _graphs:
        return wrapped(*args, **kwargs)
    targets, fetches, feeds = args[1], args[2], args[3]
    entries = None
    with fail_open("horovod.graph_stamp_run"):
        entries = _entries_for(session, graph, targets, fetches, feeds)
    if not entries:
        return wrapped(*args, **kwargs)
    both = list(fetches) + [e.pair for e in entries]
    results = wrapped(args[0], targets, both, *args[3:], **kwargs)
    with fail_open("horovod.graph_stamp_values"):
        for entry, (t0, t1) in zip(entries, results[len(fetches) :]):
            t0_ns, t1_ns = int(t0 * 1e9), int(t1 * 1e9)
            _step.found.extend((s, t0_ns, t1_ns, entry.group) for s in entry.stamps)
        _step.stamped = True
    return results[: len(fetches)]


def _entries_for(session: Any, graph: Any, targets: list, fetches: list, feeds: dict) -> Any:
    """The stamps this run fetches now: a list on a detail step whose run is prepared (or
    built on its step), else None; queues the run's preparation the first time it is seen."""
    key = _run_key(targets, fetches, feeds)
    with _lock:
        runs = _runs.setdefault(graph, {})
        known = runs.get(key)
    if known is None:
        known = _queue(session, graph, key, targets, fetches, feeds)
    if not _step.detail:
        return None
    if isinstance(known, _Ready) and detail_twin.is_open(known.generation):
        return known.entries
    if _step.every_step or known is _ON_STEP:
        count("horovod_graph_stamps_built_on_step")  # TensorFlow builds its executor here
        return _needed(graph, targets, fetches)
    _step.unprepared = True  # not prepared on every rank yet: this run goes without stamps
    return None


def _queue(session: Any, graph: Any, key: tuple, targets: list, fetches: list, feeds: dict) -> Any:
    """Queue a run's preparation on the twin thread; what the run's key now stands for."""
    feed_types = _feed_types(feeds) if _ahead[0] else None
    with _lock:
        runs = _runs.setdefault(graph, {})
        if key in runs:
            return runs[key]
        if len(runs) >= _MAX_RUNS:
            count("horovod_graph_stamps_runs_full")
            return _ON_STEP
        runs[key] = _ON_STEP if feed_types is None else _QUEUED
    if feed_types is not None:
        work = _Preparation(runs, graph, session, key, list(targets), list(fetches), feed_types)
        if detail_twin.prepare_later(work.find) is None:
            work.give_up()
    with _lock:
        return runs.get(key, _ON_STEP)


def _depends_on(ops: List[Any]) -> set:
    """Names of every op the given ops depend on (inputs and control inputs), bounded."""
    seen: set = set()
    stack = list(ops)
    while stack and len(seen) < _MAX_WALK:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def _feed_types(feeds: dict) -> Optional[List[Tuple[Any, Any, int]]]:
    """(placeholder, dtype, rank) of each feed, never its value; None where a feed is not an
    array (a tensor handle): such a run is not prepared ahead."""
    found = []
    for ref, value in feeds.items():
        dtype, ndim = getattr(value, "dtype", None), getattr(value, "ndim", None)
        if dtype is None or ndim is None:
            return None
        found.append((ref.deref(), dtype, int(ndim)))
    return found


def _needed(graph: Any, targets: list, fetches: list) -> List[Entry]:
    """The stamped collectives a run executes (the graph walked back from what it fetches)."""
    with _lock:
        entries = list(_graphs.get(graph, ()))
    if not entries:
        return []
    names = _depends_on([t.op for t in fetches] + list(targets))
    return [e for e in entries if e.op_name in names]


@dataclass
class _Preparation:
    """One run's preparation on the twin thread (detail_twin.prepare_later)."""

    runs: Dict[tuple, Any]  # its graph's runs when queued (replaced whole when stamps are added)
    graph: Any
    session: Any
    key: tuple
    targets: list
    fetches: list
    feeds: List[Tuple[Any, Any, int]]  # (placeholder, dtype, rank) of each feed

    def find(self, generation: int) -> Optional[Callable[[], None]]:
        """Python, paced: the stamps the run needs; the build left for TensorFlow's C++."""
        entries = _needed(self.graph, self.targets, self.fetches)
        if not entries:
            self._done(_Ready([], generation))
            return None
        return lambda: self._build(entries, generation)

    def _build(self, entries: List[Entry], generation: int) -> None:
        try:
            build(self.session, self.targets, self.fetches + [e.pair for e in entries], self.feeds)
        except Exception as exc:  # noqa: BLE001
            report_failure("horovod.graph_stamps_build", exc)
            entries = []  # this run's detail steps go without stamps rather than risk the run
        else:
            count("horovod_graph_stamps_prepared")
        self._done(_Ready(entries, generation))

    def _done(self, state: Any) -> None:
        with _lock:
            if self.runs.get(self.key) is _QUEUED:
                self.runs[self.key] = state
        self.session = self.graph = None

    def give_up(self) -> None:
        """Not queued (queue full): its detail steps build it themselves."""
        self._done(_ON_STEP)


class _Ran(Exception):
    """TensorFlow ran a run it was asked to build only (never expected)."""


def build(session: Any, targets: list, fetches: list, feeds: List[Tuple[Any, Any, int]]) -> None:
    """Have TensorFlow build (and cache) the executor of the run (feeds, fetches, targets)
    without running it: the run asks for an inter-op thread pool that does not exist, which
    the session checks after building the executor and before starting it. Feeds get empty
    arrays of their type: the refusal comes before any value is read."""
    import numpy as np
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.client import pywrap_tf_session as tf_session
    from tensorflow.python.framework import errors

    options = config_pb2.RunOptions(inter_op_thread_pool=_INVALID_POOL)
    buffer = tf_session.TF_NewBufferFromString(options.SerializeToString())
    feed_dict = {t._as_tf_output(): np.zeros((0,) * ndim, dtype) for t, dtype, ndim in feeds}
    try:
        session._call_tf_sessionrun(
            buffer,
            feed_dict,
            [t._as_tf_output() for t in fetches],
            [op._c_op for op in targets],
            None,
        )
    except errors.InvalidArgumentError as exc:
        if _REFUSAL in str(exc):
            return  # built, not started
        raise
    finally:
        tf_session.TF_DeleteBuffer(buffer)
    count("horovod_graph_stamps_prepare_ran")
    _ahead[0] = False
    raise _Ran("a refused run ran; TF1 runs are no longer prepared ahead")
