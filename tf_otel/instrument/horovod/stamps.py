"""Horovod collectives timed by every rank itself, in its graph: the default source of collective
spans (the runtime side; ``sources.horovod_stamp_records`` turns stamps into records).

Usage::

    from tf_otel.instrument.horovod.stamps import hook
    hook.register()   # step hook, its message handlers (hvd.a, hvd.l), its exit hand-over

Why not Horovod's timeline (measured, docs/guides/HOROVOD.md): with ``HOROVOD_TIMELINE`` set,
rank 0's timeline writer thread spins (``sched_yield``) from ``hvd.init()`` on, a core's worth
of CPU even while no file is written, and writes every event with two ``lseek`` and one
``write``; only rank 0 writes, and on response-cache hits it has no per-rank arrivals.

Instead, where the program builds a Horovod op (``MPI_LIB.horovod_allreduce`` and the other
collectives) while a detail twin of the step's tf.function is traced (instrument/detail_twin.py:
the program's own trace gets no timing op), the graph gets two stamps: one after the op's inputs
are ready (this rank's arrival), one after its outputs (this rank's end), written to a small
variable per op. Plain ``tf.timestamp`` ops only as the first stamps of a ``tf.cond`` branch;
elsewhere a call of a small function writing the op's variable, so the stamps add no order
between collectives (docs/guides/HOROVOD.md). TF1 graphs: graph_stamps. Eager calls are timed
in Python.

On a collective-detail step (picked by ``TF_OTEL_HOROVOD_EVERY`` from the step trace id, the
same steps on every rank) the training thread reads all stamps with one function call; the
export thread sends the arrivals to rank 0 (``hvd.a``), which broadcasts each tensor's last
arrival and its rank, and on dense detail the groups of tensors that completed together
(``hvd.l``); every rank then emits its own collective / wait / transfer records.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from tf_otel import clock, record
from tf_otel.cluster import messages
from tf_otel.health import count, fail_open
from tf_otel.instrument import detail_twin, detail_twin_gate
from tf_otel.instrument._patching import (
    Error,
    HookOrder,
    StepCall,
    StepHook,
    add_step_hook,
    is_active,
)
from tf_otel.instrument.horovod import graph_stamps
from tf_otel.instrument.horovod.collective_source import OFF, STAMPS, choice
from tf_otel.instrument.horovod.replicas import ReplicaNames
from tf_otel.runtime.gather import Gather, to_every_rank, to_reference
from tf_otel.runtime.lifecycle import current_pipeline
from tf_otel.runtime.steps import Pipeline
from tf_otel.sources import horovod_stamp_records as hs
from tf_otel.sources import horovod_timeline as tl
from tf_otel.step_handle import StepHandle

HOROVOD, TENSORFLOW = "horovod", "tensorflow"  # whose collective ops (span name prefix)
_MAX_STEPS = 64
_MAX_SLOTS = 20_000  # stamped ops over all traces (a function retraced without end stops here)
_GATHER_WAIT_S = 5.0  # rank 0 answers with the ranks it has after this long
_EXIT_WAIT_S = 3.0
_STALE_NS = 100_000  # float64 seconds round to ~0.2 µs; older stamps ran before this step

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

PARTS_DENSE_EVERY = 10  # detail on 1 step in fewer than this: no wait / transfer children


def parts_wanted(setting: Optional[bool], every: int) -> bool:
    """Wait / transfer children (TF_OTEL_HOROVOD_PARTS); unset: only where detail is sparse."""
    return setting if setting is not None else every >= PARTS_DENSE_EVERY


def fused_wanted(setting: Optional[bool], every: int) -> bool:
    """One span per group of tensors that completed together (TF_OTEL_HOROVOD_FUSED); unset:
    only where detail is dense (span volume is what dense detail costs, docs/guides/HOROVOD.md)."""
    return setting if setting is not None else 0 < every < PARTS_DENSE_EVERY


def _world_size() -> int:
    """The ranks in every collective: those that run steps (a parameter server runs none)."""
    pipeline = current_pipeline()
    return pipeline.topology.step_world_size if pipeline is not None else 1


def _collective_world() -> int:
    """Horovod's size once it is up, else the job's stepping ranks (tf.distribute)."""
    if choice.basics is not None:
        return int(choice.basics.size())
    return _world_size()


class StampCollector:
    """Graph stamps, the detail-step policy, and the cross-rank arrival exchange."""

    def __init__(self) -> None:
        self.parts = True  # wait / transfer children (TF_OTEL_HOROVOD_PARTS)
        self.fused = False  # one span per group of tensors that completed together
        self.backend: Optional[str] = None
        self.enabled: Callable[[], bool] = lambda: False  # graph stamps here (a twin's trace)
        self.graph_enabled: Callable[[], bool] = lambda: False  # TF1 graph stamps
        self._slots: List[Tuple[Any, List[hs.Stamp], Optional[str]]] = []
        self._reader: Any = None
        self._reader_n = -1
        self._eager: Optional[List[Tuple[hs.Stamp, int, int, Optional[str]]]] = None
        self._lock = threading.Lock()
        self._mine: OrderedDict[Tuple[str, int], Dict[str, Any]] = OrderedDict()
        # rank 0: each detail step's arrivals, {rank: {tensor: reference ns}}
        self._gather: Gather[Tuple[str, int], Dict[str, int]] = Gather(
            _world_size, self._answer, _GATHER_WAIT_S, _MAX_STEPS, "horovod_stamp_gathers_dropped"
        )
        self._branches: weakref.WeakSet[Any] = weakref.WeakSet()  # cond branches stamped
        self._outstanding: Dict[Tuple[str, int], None] = {}  # detail steps not emitted yet
        self._unshared: OrderedDict[Tuple[str, int], list] = OrderedDict()  # read, not sent
        self._replicas = ReplicaNames()
        self._spreads: OrderedDict[Tuple[str, int], Dict[str, hs.ReplicaSpread]] = OrderedDict()

    # -- graph construction (any thread that builds the program's graph) --------------------

    def wrapper(self, op: str, grouped: bool, library: str = HOROVOD) -> Callable:
        """The timed stand-in of a collective op function of ``library`` (Horovod's MPI_LIB,
        or TensorFlow's collective_ops: instrument/tf_collectives.py)."""

        def wrapped_op(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
            tf = sys.modules.get("tensorflow")
            if tf is None or not args:
                return wrapped(*args, **kwargs)
            if tf.executing_eagerly():
                return self._eager_call(tf, wrapped, args, kwargs, op, grouped, library)
            with tf.init_scope():
                eager_outside = tf.executing_eagerly()
            if not eager_outside:  # a TF1 graph: stamps a detail step's Session.run fetches
                if not self.graph_enabled():
                    return wrapped(*args, **kwargs)

                def naming(out: Any) -> Tuple[List[hs.Stamp], Optional[str]]:
                    name = tf.nest.flatten(out)[0].op.name
                    return _stamps_of(name, args[0], op, grouped, kwargs, library)

                return graph_stamps.around_op(tf, wrapped, args, kwargs, naming, grouped)
            out = self._in_function(tf, wrapped, args, kwargs, op, grouped, library)
            with fail_open("horovod.note_built"):
                _note_built(op, tf.nest.flatten(out)[0].op.name)
            return out

        return wrapped_op

    def _in_function(
        self,
        tf: Any,
        wrapped: Callable,
        args: tuple,
        kwargs: dict,
        op: str,
        grouped: bool,
        library: str,
    ) -> Any:
        """The op built in a tf.function: stamped where this is a detail twin's trace."""
        if not self.enabled():
            return wrapped(*args, **kwargs)
        if len(self._slots) >= _MAX_SLOTS:
            count("horovod_stamps_full")
            return wrapped(*args, **kwargs)
        before = None
        with fail_open("horovod.stamp"):
            before = self._before(tf, args[0], grouped)
        if before is None:
            return wrapped(*args, **kwargs)
        with tf.control_dependencies([before[1]]):
            out = wrapped(*args, **kwargs)
        with fail_open("horovod.stamp"):
            self._after(tf, args[0], out, before, op, grouped, kwargs, library)
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
        op: str,
        grouped: bool,
        kwargs: dict,
        library: str,
    ) -> None:
        slot, arrival, plain = before
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
        self,
        tf: Any,
        wrapped: Callable,
        args: tuple,
        kwargs: dict,
        op: str,
        grouped: bool,
        library: str,
    ) -> Any:
        sink = self._eager
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

    # -- training thread ----------------------------------------------------------------------

    @property
    def every(self) -> int:
        """TF_OTEL_HOROVOD_EVERY, shared with the timeline source (``choice.every``)."""
        return choice.every

    @every.setter
    def every(self, value: int) -> None:
        choice.every = value

    def wanted(self, handle: StepHandle) -> bool:
        return choice.wanted(handle)

    def begin(self, handle: StepHandle) -> Optional[int]:
        """A sampled step starts: when it is a collective-detail step, its start (wall clock,
        ns) and collect; else None."""
        if not self.wanted(handle):
            return None
        self._eager = []
        return time.time_ns()

    def end(
        self,
        handle: StepHandle,
        started: Optional[int],
        fetched: Optional[List[Found]] = None,
    ) -> None:
        """A sampled step ended; ``started``: what ``begin`` gave; ``fetched``: its TF1 graph
        stamps (graph_stamps), if any."""
        if started is None:
            if self.every > 0:
                self._prepare_reader()
            return
        eager, self._eager = self._eager or [], None
        found: List[Found] = list(eager)
        candidates: List[Found] = list(fetched or [])
        if fetched is None:
            values = self._read()
            with self._lock:
                slots = list(self._slots[: len(values)])
            for (_, stamps, group), (t0, t1) in zip(slots, values):
                t0_ns, t1_ns = int(t0 * 1e9), int(t1 * 1e9)
                candidates.extend((s, t0_ns, t1_ns, group) for s in stamps)
        found.extend(c for c in candidates if c[1] >= started - _STALE_NS)
        key, step = handle.key, handle.step
        with self._lock:
            self._outstanding[(key, step)] = None
            self._unshared[(key, step)] = found
            while len(self._outstanding) > _MAX_STEPS:
                self._outstanding.pop(next(iter(self._outstanding)))
            while len(self._unshared) > _MAX_STEPS:
                self._unshared.popitem(last=False)
        # on the export thread, after this step's span exists (records of it may follow)
        handle.deferred.append(lambda: self._share_pending(key, step))

    def _share_pending(self, key: str, step: int) -> list:
        with self._lock:
            found = self._unshared.pop((key, step), None)
        return self._share(key, step, found) if found is not None else []

    def _prepare_reader(self) -> None:
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

    def _read(self) -> List[Tuple[float, float]]:
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

    # -- export thread: share arrivals, emit ------------------------------------------------------

    def _share(self, key: str, step: int, found: list) -> list:
        pipeline = current_pipeline()
        if pipeline is None or not found:
            with self._lock:
                self._outstanding.pop((key, step), None)
            return []
        found, spreads = hs.merge_replicas(found)
        shift = clock.now_ns() - time.time_ns()  # wall clock (tf.timestamp) -> tf_otel's local
        model = clock.current_model()
        mine = {}
        arrivals = {}
        for stamp, t0, t1, group in found:
            local0, local1 = t0 + shift, t1 + shift
            mine[stamp.tensor] = (stamp, local0, local1, group)
            arrivals[stamp.tensor] = model.to_reference(local0)
        with self._lock:
            self._mine[(key, step)] = mine
            if spreads:
                self._spreads[(key, step)] = spreads
            while len(self._mine) > _MAX_STEPS:
                self._mine.popitem(last=False)
                count("horovod_stamp_steps_dropped")
            while len(self._spreads) > _MAX_STEPS:
                self._spreads.popitem(last=False)
        message: messages.HorovodArrivals = {
            "t": messages.HVD_ARRIVALS,
            "k": key,
            "s": step,
            "a": arrivals,
        }
        to_reference(pipeline, message, self.on_arrivals)
        return []

    def on_arrivals(self, rank: int, message: Mapping[str, Any]) -> None:
        """Rank 0 (coordinator thread): one rank's arrivals for one step."""
        arrivals = {str(k): int(v) for k, v in message["a"].items()}
        self._gather.add((str(message["k"]), int(message["s"])), rank, arrivals)

    def _answer(self, round_id: Tuple[str, int], per_rank: Dict[int, Dict[str, int]]) -> None:
        """Rank 0: a step's last arrival per tensor, to every rank (and itself)."""
        key, step = round_id
        pipeline = current_pipeline()
        if pipeline is None:
            return
        missing = pipeline.topology.world_size - len(per_rank)
        if missing > 0:
            count("horovod_stamp_ranks_missing", missing)
        verdicts = pipeline.exporter.verdicts  # the step's root judges by the first arrivals
        if verdicts is not None:
            first = {rank: min(arrived.values()) for rank, arrived in per_rank.items() if arrived}
            verdicts.note_arrivals(key, step, first)
        last = hs.last_arrivals(per_rank)
        lasts = {n: list(v) for n, v in last.items()}
        reply: messages.HorovodLast = {"t": messages.HVD_LAST, "k": key, "s": step, "l": lasts}
        if self.fused:  # rank 0 is in every response: its own ends group them for every rank
            with self._lock:
                own = dict(self._mine.get((key, step)) or {})
            groups = hs.completed_together({t: (m[0].op, m[0].dtype, m[2]) for t, m in own.items()})
            if groups:
                reply["g"] = groups
        to_every_rank(pipeline, reply, self.on_last)

    def on_last(self, message: Mapping[str, Any]) -> None:
        """Every rank: the last arrivals of one step -> this rank's records."""
        key, step = str(message["k"]), int(message["s"])
        with self._lock:
            mine = self._mine.pop((key, step), None)
            spreads = self._spreads.pop((key, step), {})
            self._outstanding.pop((key, step), None)
        pipeline = current_pipeline()
        if not mine or pipeline is None:
            return
        rank = pipeline.topology.rank
        last = message.get("l") or {}
        records = []
        prefix = f"{key}/{step}/"
        model = clock.current_model()
        child_wait = hs.MIN_CHILD_WAIT_NS if self.parts else None
        done: set = set()
        for names in message.get("g") or []:  # tensors that completed together: one span
            members = [(mine[n][0], mine[n][1], mine[n][2]) for n in names if n in mine]
            if len(members) < 2:
                continue
            done.update(n for n in names if n in mine)
            lasts: List[Optional[Tuple[int, int]]] = [
                (int(last[n][0]), int(last[n][1])) if n in last else None
                for n in names
                if n in mine
            ]
            stamp, t0, t1, group_last = hs.fused(members, lasts)
            out = hs.records_for(
                stamp,
                t0,
                t1,
                model.to_local(group_last[0]) if group_last else None,
                group_last[1] if group_last else None,
                rank,
                step,
                tl.collective_key(key, step, stamp.tensor),
                None,
                self.backend,
                child_wait,
            )
            out[0].attributes[hs.ATTR_FUSED_TENSORS] = len(members)
            records.extend(out)
        for tensor, (stamp, t0, t1, group) in mine.items():
            if tensor in done:
                continue
            seen = last.get(tensor)
            records.extend(
                hs.records_for(
                    stamp,
                    t0,
                    t1,
                    model.to_local(int(seen[0])) if seen else None,
                    int(seen[1]) if seen else None,
                    rank,
                    step,
                    tl.collective_key(key, step, tensor),
                    prefix + group if group else None,
                    self.backend,
                    child_wait,
                    spreads.get(tensor),
                )
            )
        if records:
            pipeline.add_records(key, step, records)
            count("horovod_collectives", len(mine))

    def finish(self, is_rank0: bool, wait_s: float) -> None:
        """At exit: wait (bounded) for the records of this rank's detail steps; rank 0 then
        answers the steps some rank never reported."""
        with self._lock:
            unshared = list(self._unshared)
        for key, step in unshared:  # the export thread may be far behind at exit
            with fail_open("horovod.stamp_share"):
                self._share_pending(key, step)
        deadline = time.monotonic() + (wait_s * 2 / 3 if is_rank0 else wait_s)
        while self._outstanding and time.monotonic() < deadline:
            time.sleep(0.02)
        if is_rank0:
            self.flush()

    def flush(self) -> None:
        """Rank 0 at exit: answer the steps some rank never reported, with the ranks it has."""
        with fail_open("horovod.stamp_flush"):
            self._gather.flush()


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


collector = StampCollector()


@dataclass
class _DetailStep:
    """A collective-detail step from its start to its end."""

    started: int  # wall clock, ns: stamps older than this belong to earlier steps
    fetches: Optional[List[graph_stamps.Entry]] = None  # a TF1 run's stamp fetches


class StampsHook(StepHook[_DetailStep]):
    """The stamps' step hook: collects on detail steps, decides whether graphs get stamps."""

    order = HookOrder.HOROVOD

    def __init__(self) -> None:
        self._finished = False

    def on_step_start(self, handle: StepHandle, call: StepCall) -> Optional[_DetailStep]:
        detail_twin.note_step(handle.key, handle.step)  # rank 0 picks the first twin step past it
        if not handle.sampled or choice.mode == OFF or self._finished:
            return None
        pipeline = current_pipeline()
        if pipeline is None or (pipeline.topology.world_size < 2 and choice.replicas < 2):
            return None
        if choice.current() != STAMPS:
            return None
        if collector.backend is None:
            collector.backend = choice.backend()
        if collector.wanted(handle) and not detail_twin.ready_for(handle.key, handle.step):
            # picked, but its twin is not prepared on every rank yet: the program's own graph
            handle.attributes[record.ATTR_DETAIL_TWIN] = record.DETAIL_TWIN_PREPARING
            count("twin_detail_deferred")
            return None
        started = collector.begin(handle)
        if started is None:
            return None
        detail = _DetailStep(started)
        detail_twin.want(True)  # this step runs the twin of its function, with the stamps
        with fail_open("horovod.graph_stamp_fetches"):
            detail.fetches = graph_stamps.add_fetches(call)  # a TF1 run fetches its stamps too
        return detail

    def on_step_end(
        self, handle: StepHandle, call: StepCall, error: Error, kept: Optional[_DetailStep]
    ) -> None:
        detail_twin.want(False)
        fetched = None
        if kept is not None and kept.fetches is not None:  # the program's result back first
            fetched = graph_stamps.take_values(kept.fetches, call)
        if handle.sampled and choice.current() == STAMPS:
            collector.end(handle, kept.started if kept is not None else None, fetched)

    def stamping(self) -> bool:
        """Graph construction inside a detail twin's trace (instrument/detail_twin.py): time Horovod
        ops? The program's own traces never get timing ops."""
        return detail_twin.tracing() and self.twins_wanted()

    def twins_wanted(self) -> bool:
        """Do this process's steps need detail twins (default source, more than one rank)?"""
        if choice.current() != STAMPS or self._finished or not is_active():
            return False
        if collector.every <= 0:
            return False  # TF_OTEL_HOROVOD_EVERY=0 (default): no timing ops in the graph
        try:
            return _collective_world() > 1 or choice.replicas > 1
        except Exception:  # noqa: BLE001
            return False

    def finish(self) -> None:
        """At exit / SIGTERM: wait (bounded) for this rank's detail steps' records."""
        if self._finished or choice.current() != STAMPS:
            return
        self._finished = True
        pipeline = current_pipeline()
        if pipeline is not None:
            collector.finish(pipeline.topology.rank == 0, _EXIT_WAIT_S)

    def _handle_messages(self, pipeline: Pipeline) -> None:
        pipeline.handlers.on_reference(messages.HVD_ARRIVALS, collector.on_arrivals)
        pipeline.handlers.on_rank(messages.HVD_LAST, collector.on_last)

    def register(self, every: int, parts: Optional[bool], fused: Optional[bool] = None) -> None:
        """The step hook, its message handlers and its exit hand-over (once per process)."""
        from tf_otel.runtime.lifecycle import before_shutdown, with_pipeline

        collector.every = every
        collector.parts = parts_wanted(parts, every)
        collector.fused = fused_wanted(fused, every)
        collector.enabled = self.stamping
        collector.graph_enabled = self.twins_wanted
        detail_twin.wanted_by(self.twins_wanted)
        detail_twin.after_prepare(collector.build_reader)
        add_step_hook(self)
        with_pipeline(self._handle_messages)
        with_pipeline(detail_twin_gate.attach)
        before_shutdown(self.finish)


hook = StampsHook()
