"""The stamps' exchange between ranks: each detail step's arrivals to rank 0, the last arrival
of every tensor back to every rank, and this rank's collective records from both.

Usage::

    exchange = ArrivalExchange()
    exchange.hold(key, step, found)            # training thread: a detail step's stamps
    handle.deferred.append(lambda: exchange.share_pending(key, step))  # export thread sends them
    # rank 0's coordinator: exchange.on_arrivals (hvd.a); every rank: exchange.on_last (hvd.l)

On the export thread each rank sends its arrivals (reference clock) to rank 0 (``hvd.a``);
rank 0 gathers the step's ranks (at most ``_GATHER_WAIT_S``), tells the step's root verdict the
first arrivals, and broadcasts each tensor's last arrival and its rank and, on dense detail,
the groups of tensors that completed together (``hvd.l``); every rank then emits its own
collective / wait / transfer records (sources/horovod_stamp_records.py).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Tuple

from tf_otel import clock
from tf_otel.cluster import messages
from tf_otel.health import count, fail_open
from tf_otel.runtime.gather import Gather, to_every_rank, to_reference
from tf_otel.runtime.lifecycle import current_pipeline
from tf_otel.sources import horovod_stamp_records as hs
from tf_otel.sources import horovod_timeline as tl

_MAX_STEPS = 64
_GATHER_WAIT_S = 5.0  # rank 0 answers with the ranks it has after this long

Found = hs.Found  # a stamp, its [t0, t1] (wall ns), its group


def step_world_size() -> int:
    """The ranks in every collective: those that run steps (a parameter server runs none)."""
    pipeline = current_pipeline()
    return pipeline.topology.step_world_size if pipeline is not None else 1


class ArrivalExchange:
    """Detail steps from their stamps to records: held, shared, gathered (rank 0), emitted."""

    def __init__(self) -> None:
        self.parts = True  # wait / transfer children (TF_OTEL_HOROVOD_PARTS)
        self.fused = False  # one span per group of tensors that completed together
        self.backend: Optional[str] = None
        self._lock = threading.Lock()
        self._mine: OrderedDict[Tuple[str, int], Dict[str, Any]] = OrderedDict()
        # rank 0: each detail step's arrivals, {rank: {tensor: reference ns}}
        self._gather: Gather[Tuple[str, int], Dict[str, int]] = Gather(
            step_world_size,
            self._answer,
            _GATHER_WAIT_S,
            _MAX_STEPS,
            "horovod_stamp_gathers_dropped",
        )
        self._outstanding: Dict[Tuple[str, int], None] = {}  # detail steps not emitted yet
        self._unshared: OrderedDict[Tuple[str, int], list] = OrderedDict()  # read, not sent
        self._spreads: OrderedDict[Tuple[str, int], Dict[str, hs.ReplicaSpread]] = OrderedDict()

    def hold(self, key: str, step: int, found: List[Found]) -> None:
        """Training thread: a detail step's stamps, kept until the export thread shares them."""
        with self._lock:
            self._outstanding[(key, step)] = None
            self._unshared[(key, step)] = found
            while len(self._outstanding) > _MAX_STEPS:
                self._outstanding.pop(next(iter(self._outstanding)))
            while len(self._unshared) > _MAX_STEPS:
                self._unshared.popitem(last=False)

    def share_pending(self, key: str, step: int) -> list:
        """Export thread, after the step's span exists: send its held arrivals to rank 0."""
        with self._lock:
            found = self._unshared.pop((key, step), None)
        return self._share(key, step, found) if found is not None else []

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
                self.share_pending(key, step)
        deadline = time.monotonic() + (wait_s * 2 / 3 if is_rank0 else wait_s)
        while self._outstanding and time.monotonic() < deadline:
            time.sleep(0.02)
        if is_rank0:
            self.flush()

    def flush(self) -> None:
        """Rank 0 at exit: answer the steps some rank never reported, with the ranks it has."""
        with fail_open("horovod.stamp_flush"):
            self._gather.flush()
