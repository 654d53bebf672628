"""Collective ops timed in the graph of a detail twin: the stamps' graph side.

Usage::

    graph = StampGraph()
    MPI_LIB.horovod_allreduce = wrapt.FunctionWrapper(original, graph.wrapper("allreduce", False))
    graph.build_reader()        # once the twin is prepared (the twin thread)
    values = graph.read()       # a detail step's end: [(t0, t1)] per stamped op, wall seconds

Where a collective op is built while a detail twin's function is traced, the graph gets two
stamps: one once the op's inputs are ready (this rank's arrival), one after its outputs (its
end), written to a small variable per op; every variable is read back with one function call.
Plain ``tf.timestamp`` ops only as the first stamps of a ``tf.cond`` branch; elsewhere a call
of a small function that writes the op's variable, so the stamps add no order between
collectives (docs/guides/HOROVOD.md). TF1 graphs: graph_stamps. Eager calls are timed in
Python into the sink a detail step opens.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import weakref
from typing import Any, Callable, List, NamedTuple, Optional, Tuple

from tf_otel.health import count, fail_open
from tf_otel.instrument import detail_twin
from tf_otel.instrument.horovod import graph_stamps
from tf_otel.instrument.horovod.replicas import ReplicaNames
from tf_otel.runtime.lifecycle import current_pipeline
from tf_otel.sources import horovod_stamp_records as hs

HOROVOD, TENSORFLOW = "horovod", "tensorflow"  # whose collective ops (span name prefix)
_MAX_SLOTS = 20_000  # stamped ops over all traces (a function retraced without end stops here)

# MPI_LIB function -> (op, grouped)
OPS = {
    "horovod_allreduce": ("allreduce", False),
    "horovod_grouped_allreduce": ("allreduce", True),
    "horovod_allgather": ("allgather", False),
    "horovod_grouped_allgather": ("allgather", True),
    "horovod_broadcast": ("broadcast", False),
    "horovod_alltoall": ("alltoall", False),
    "horovod_reducescatter": ("reducescatter", False),
    "horovod_grouped_reducescatter": ("reducescatter", True),
}

Found = hs.Found  # a stamp, its [t0, t1] (wall ns), its group


class OpKind(NamedTuple):
    """Which collective a stand-in times: the op, grouped or not, whose library."""

    op: str
    grouped: bool
    library: str


Slot = Tuple[Any, List[hs.Stamp], Optional[str]]  # (stamp variable, its stamps, its group)


class StampGraph:
    """The stamped ops of every detail twin's trace, the eager sink, and the one reader."""

    def __init__(self) -> None:
        self.enabled: Callable[[], bool] = lambda: False  # graph stamps here (a twin's trace)
        self.graph_enabled: Callable[[], bool] = lambda: False  # TF1 graph stamps
        self.eager: Optional[List[Found]] = None  # a detail step's eager collectives
        self._slots: List[Slot] = []
        self._reader: Any = None
        self._reader_n = -1
        self._lock = threading.Lock()
        self._branches: weakref.WeakSet[Any] = weakref.WeakSet()  # cond branches stamped
        self._replicas = ReplicaNames()

    # -- graph construction (any thread that builds the program's graph) --------------------

    def wrapper(self, op: str, grouped: bool, library: str = HOROVOD) -> Callable:
        """The timed stand-in of a collective op function of ``library`` (Horovod's MPI_LIB,
        or TensorFlow's collective_ops: instrument/tf_collectives.py)."""
        kind = OpKind(op, grouped, library)

        def wrapped_op(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
            tf = sys.modules.get("tensorflow")
            if tf is None or not args:
                return wrapped(*args, **kwargs)
            if tf.executing_eagerly():
                return self._eager_call(tf, wrapped, args, kwargs, kind)
            with tf.init_scope():
                eager_outside = tf.executing_eagerly()
            if not eager_outside:  # a TF1 graph: stamps a detail step's Session.run fetches
                if not self.graph_enabled():
                    return wrapped(*args, **kwargs)

                def naming(out: Any) -> Tuple[List[hs.Stamp], Optional[str]]:
                    name = tf.nest.flatten(out)[0].op.name
                    return _stamps_of(name, args[0], op, grouped, kwargs, library)

                return graph_stamps.around_op(tf, wrapped, args, kwargs, naming, grouped)
            out = self._in_function(tf, wrapped, args, kwargs, kind)
            with fail_open("horovod.note_built"):
                _note_built(op, tf.nest.flatten(out)[0].op.name)
            return out

        return wrapped_op

    def _in_function(
        self, tf: Any, wrapped: Callable, args: tuple, kwargs: dict, kind: OpKind
    ) -> Any:
        """The op built in a tf.function: stamped where this is a detail twin's trace."""
        if not self.enabled():
            return wrapped(*args, **kwargs)
        if len(self._slots) >= _MAX_SLOTS:
            count("horovod_stamps_full")
            return wrapped(*args, **kwargs)
        before = None
        with fail_open("horovod.stamp"):
            before = self._before(tf, args[0], kind.grouped)
        if before is None:
            return wrapped(*args, **kwargs)
        with tf.control_dependencies([before[1]]):
            out = wrapped(*args, **kwargs)
        with fail_open("horovod.stamp"):
            self._after(tf, args[0], out, before, kind, kwargs)
        return out

    def cond_wrapper(self, grouped: bool) -> Callable:
        """Horovod's ``_allreduce_cond`` in a TF1 graph: stamped around the cond."""

        def wrapped_cond(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
            tf = sys.modules.get("tensorflow")
            if tf is None or not args or tf.executing_eagerly() or not self.graph_enabled():
                return wrapped(*args, **kwargs)
            return graph_stamps.around_cond(tf, wrapped, args, kwargs, grouped)

        return wrapped_cond

    def _before(self, tf: Any, inputs: Any, grouped: bool) -> Optional[Tuple[Any, Any, bool]]:
        """(stamp variable, arrival stamp, plain?) for the op about to be built, or None."""
        from tensorflow.python.ops import resource_variable_ops

        # the class itself, not tf.Variable(...): tf.function's variable creator refuses
        # variables made on a later trace, even lifted ones, and only sees tf.Variable(...)
        with tf.init_scope(), tf.device("/cpu:0"):
            slot = resource_variable_ops.ResourceVariable(
                tf.zeros([2], tf.float64), trainable=False, name="tf_otel_hvd_stamp"
            )
        plain = self._alone_in_branch(tf)
        with tf.control_dependencies(list(inputs) if grouped else [inputs]):
            before = tf.timestamp() if plain else _stamp_functions(tf)[0](slot)
        return slot, before, plain

    def _alone_in_branch(self, tf: Any) -> bool:
        """Plain ``tf.timestamp`` ops only as the first stamps of a ``tf.cond`` branch (where
        Horovod's tape and optimizer put each gradient's collective): tf.function runs stateful
        ops that take no resource in program order, so plain stamps beside other collectives
        would chain them one after another (0.526x on MobileNetV2, docs/guides/HOROVOD.md); a
        call of a function that writes the op's own variable is ordered only against that
        variable."""
        graph = tf.compat.v1.get_default_graph()
        if type(graph).__name__ != "CondBranchFuncGraph":
            return False
        with self._lock:
            first = graph not in self._branches
            self._branches.add(graph)
        return first

    def _after(
        self,
        tf: Any,
        inputs: Any,
        out: Any,
        before: Tuple[Any, Any, bool],
        kind: OpKind,
        kwargs: dict,
    ) -> None:
        slot, arrival, plain = before
        op, grouped, library = kind
        outs = tf.nest.flatten(out)
        with tf.control_dependencies(outs):
            if plain:
                slot.assign(tf.stack([arrival, tf.timestamp()]))
            else:
                _stamp_functions(tf)[1](slot, arrival)
        name, replica = outs[0].op.name, None
        if library == TENSORFLOW:  # one of several devices of this process (MirroredStrategy)?
            name, replica = self._replicas.name_for(
                tf.compat.v1.get_default_graph(), outs[0].device, name
            )
        stamps, group = _stamps_of(name, inputs, op, grouped, kwargs, library)
        if replica is not None:
            stamps = [dataclasses.replace(s, replica=replica) for s in stamps]
        with self._lock:
            self._slots.append((slot, stamps, group))

    def _eager_call(
        self, tf: Any, wrapped: Callable, args: tuple, kwargs: dict, kind: OpKind
    ) -> Any:
        op, grouped, library = kind
        sink = self.eager
        if sink is None:
            out = wrapped(*args, **kwargs)
            _note_done(op, kwargs)
            return out
        start = time.time_ns()
        out = wrapped(*args, **kwargs)
        end = time.time_ns()
        _note_done(op, kwargs)
        with fail_open("horovod.stamp"):
            name = kwargs.get("name") or f"eager_{op}_{len(sink)}"
            stamps, group = _stamps_of(name, args[0], op, grouped, kwargs, library)
            sink.extend((s, start, end, group) for s in stamps)
        return out

    def slots(self, n: int) -> List[Slot]:
        """The first ``n`` stamped ops, in the order the reader reads them."""
        with self._lock:
            return list(self._slots[:n])

    # -- the reader (a detail step's end, or the twin thread once a twin is prepared) ----------

    def prepare_reader(self) -> None:
        """A step that is no detail step ended: when its call traced new stamped ops, build the
        reader now: that falls on a step that was tracing anyway, not on the first detail step
        of a run (1 in 100 would pay it inside the run)."""
        if not self._slots or len(self._slots) == self._reader_n:  # no lock, no TF call
            return
        if detail_twin.preparing():  # the twin thread is adding stamps: it builds the reader after
            return
        self.build_reader()

    def build_reader(self) -> None:
        """Build the reader of every stamp now (the twin thread, once a twin is prepared)."""
        if not self._slots or len(self._slots) == self._reader_n:
            return
        with fail_open("horovod.stamp_reader"):
            self._reader_for()

    def _reader_for(self) -> Any:
        """The traced function that reads every stamp variable (rebuilt when ops were added)."""
        tf = sys.modules.get("tensorflow")
        with self._lock:
            variables = [slot for slot, _, _ in self._slots]
        if tf is None or not variables:
            return None
        if self._reader is None or self._reader_n != len(variables):
            from tf_otel.instrument._patching import state

            # one attempt per set of stamps: a reader that fails to build is not retried each step
            self._reader, self._reader_n = None, len(variables)
            reader = tf.function(
                lambda: tf.stack([v.read_value() for v in variables]), autograph=False
            )
            state.depth += 1  # our own function is no training step
            try:
                with tf.init_scope():  # never into a graph the program has as its default
                    reader()  # trace and instantiate now (~0.3 s for 340 stamps)
            finally:
                state.depth -= 1
            self._reader = reader
        return self._reader

    def read(self) -> List[Tuple[float, float]]:
        """Every stamp variable in one function call (a few µs per stamp, on the training thread,
        detail steps only)."""
        reader = self._reader_for()
        if reader is None:
            return []
        from tf_otel.instrument._patching import state

        tf = sys.modules["tensorflow"]
        state.depth += 1  # our own function call is no training step
        try:
            with tf.init_scope():
                return [tuple(row) for row in reader().numpy().tolist()]
        finally:
            state.depth -= 1


_STAMP_FUNCTIONS: List[Any] = []


def _note_built(op: str, name: str) -> None:
    """The collective just built, in the step whose trace builds it (stall records)."""
    pipeline = current_pipeline()
    if pipeline is None:
        return
    handle = pipeline.tracker.in_flight.get(threading.get_ident())
    if handle is not None:  # else built outside any step (a graph built before training)
        pipeline.collectives.note_built(handle.key, op, name)


def _note_done(op: str, kwargs: dict) -> None:
    """An eager collective returned on this rank (stall records: its last completed one)."""
    with fail_open("horovod.note_done"):
        pipeline = current_pipeline()
        if pipeline is not None:
            pipeline.collectives.note_done(op, str(kwargs.get("name") or op))


def _stamp_functions(tf: Any) -> List[Any]:
    """[arrive(slot) -> t0, leave(slot, t0)]: the stamps as calls of tf_otel's own small
    functions that write the op's variable, made once per process."""
    if not _STAMP_FUNCTIONS:

        def arrive(slot: Any) -> Any:
            now = tf.timestamp()
            slot.assign(tf.stack([now, now]))
            return now

        def leave(slot: Any, arrival: Any) -> Any:
            now = tf.timestamp()
            slot.assign(tf.stack([arrival, now]))
            return now

        _STAMP_FUNCTIONS[:] = [
            tf.function(arrive, autograph=False),
            tf.function(leave, autograph=False),
        ]
    return _STAMP_FUNCTIONS


def _stamps_of(
    name: str, inputs: Any, op: str, grouped: bool, kwargs: dict, library: str = HOROVOD
) -> Tuple[List[hs.Stamp], Optional[str]]:
    """Horovod's tensor names for an op (the node name, scope stripped with
    ignore_name_scope; grouped: <name>_<i>of<n>), with dtypes and static shapes."""
    if kwargs.get("ignore_name_scope"):
        name = name.rsplit("/", 1)[-1]
    tensors = list(inputs) if grouped else [inputs]
    hint = kwargs.get("communication_hint") if library == TENSORFLOW else None
    backend = str(hint).lower() if hint else None
    stamps = []
    for i, tensor in enumerate(tensors):
        dtype = getattr(getattr(tensor, "dtype", None), "name", None)
        dims = None
        with fail_open("horovod.stamp_shape"):
            dims = tensor.shape.as_list()
        stamps.append(
            hs.Stamp(
                tensor=f"{name}_{i + 1}of{len(tensors)}" if grouped else name,
                op=op,
                dtype=dtype,
                shape=str(dims) if dims is not None else None,
                nbytes=hs.nbytes(dtype, dims),
                library=library,
                backend=backend,
            )
        )
    return stamps, (name if grouped else None)
