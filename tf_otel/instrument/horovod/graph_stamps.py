"""Horovod collectives in TF1 graphs (``Session.run``) timed by every rank itself: timing ops
that run only when a detail step fetches them.

Usage (by ``stamps``; nothing here is called by the program)::

    from tf_otel.instrument.horovod import graph_stamps
    out = graph_stamps.around_op(tf, wrapped, args, kwargs, op, grouped)      # MPI_LIB op
    out = graph_stamps.around_cond(tf, wrapped, args, kwargs, op, grouped)    # Horovod's cond
    entries = graph_stamps.add_fetches(call)         # detail step's start: fetch its stamps too
    found = graph_stamps.take_values(entries, call)  # its end: [(Stamp, t0_ns, t1_ns, group)]

A TF1 graph runs only what a run fetches. Where the program builds a Horovod op in a plain TF1
graph, the graph gets ``stack([timestamp after the op's inputs, timestamp after its outputs])``,
which nothing depends on: a run that does not fetch it never runs it (steps without detail run
the program's graph as it would, no standing cost). On a collective-detail step the step's
``Session.run`` fetches, beside the program's fetches, the stamps of the collectives that the
program's fetches depend on (found once per graph and fetch signature by walking the graph
backwards), so a run never executes a collective it would not have run.

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
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from tf_otel import record
from tf_otel.health import count, fail_open
from tf_otel.sources import horovod_stamp_records as hs

if TYPE_CHECKING:
    from tf_otel.instrument._patching import StepCall

_MAX_ENTRIES = 20_000  # stamped collectives per graph
_MAX_SIGNATURES = 256  # fetch signatures per graph whose stamp set is remembered
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
_needed: weakref.WeakKeyDictionary[Any, Dict[str, List[Entry]]] = weakref.WeakKeyDictionary()
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
        _needed.pop(graph, None)  # new stamps: what runs need is found again


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


# -- the step (training thread) ------------------------------------------------------------------


def _fetch_ops(graph: Any, fetches: Any, tf: Any) -> List[Any]:
    ops = []
    for item in tf.nest.flatten(fetches):
        with fail_open("horovod.graph_stamp_fetch"):
            element = graph.as_graph_element(item, allow_tensor=True, allow_operation=True)
            ops.append(element if hasattr(element, "node_def") else element.op)
    return ops


def _depends_on(ops: List[Any]) -> set:
    """Names of every op the fetched ops depend on (inputs and control inputs), bounded."""
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


def _needed_by(graph: Any, fetches: Any, tf: Any) -> List[Entry]:
    from tf_otel.instrument.session import fetch_signature

    signature = fetch_signature(fetches)
    with _lock:
        entries = list(_graphs.get(graph, ()))
        cache = _needed.setdefault(graph, {})
        found = cache.get(signature)
    if found is not None or not entries:
        return found or []
    names = _depends_on(_fetch_ops(graph, fetches, tf))
    found = [e for e in entries if e.op_name in names]
    with _lock:
        if len(cache) < _MAX_SIGNATURES:
            cache[signature] = found
    return found


def add_fetches(call: StepCall) -> Optional[List[Entry]]:
    """A detail step's ``Session.run``: fetch the stamps of the collectives it runs as well; the
    entries fetched (for ``take_values``), None where none."""
    import sys

    tf = sys.modules.get("tensorflow")
    if tf is None or call.kind != record.SESSION_RUN or not _graphs:
        return None
    graph = getattr(call.instance, "graph", None)
    in_args = bool(call.args)
    fetches = call.args[0] if in_args else call.kwargs.get("fetches")
    if graph is None or fetches is None:
        return None
    entries = _needed_by(graph, fetches, tf)
    if not entries:
        return None
    both = (fetches, [e.pair for e in entries])
    if in_args:
        call.args = (both,) + tuple(call.args[1:])
    else:
        call.kwargs = {**call.kwargs, "fetches": both}
    return entries


def take_values(
    entries: List[Entry], call: StepCall
) -> List[Tuple[hs.Stamp, int, int, Optional[str]]]:
    """The step's end: give the program its own result back; this step's stamps."""
    result = call.result
    if not isinstance(result, tuple) or len(result) != 2:
        return []  # the run failed: call.result is not ours to change
    call.result, values = result
    found: List[Tuple[hs.Stamp, int, int, Optional[str]]] = []
    for entry, (t0, t1) in zip(entries, values):
        found.extend((s, int(t0 * 1e9), int(t1 * 1e9), entry.group) for s in entry.stamps)
    return found
