"""Horovod collectives from each rank's own timestamps -> per-rank collective Records.

Every rank times, inside its own graph, when it handed a tensor to Horovod (its arrival) and
when the result came back (its end). Gathered on rank 0 (reference clock), the last arrival of
each collective is known exactly for any number of ranks, whatever Horovod's response cache
does; each rank then splits its collective into waiting for the last rank and the rest
(negotiation and data movement).

Usage::

    last = last_arrivals({rank: {tensor: arrival_ref_ns, ...}, ...})   # tensor -> (ns, rank)
    records = records_for(stamp, arrival_ns, end_ns, last_ns, last_rank, rank, step, key, group)
    groups = completed_together({tensor: (op, dtype, end_ns), ...})      # rank 0's own ends
    stamp, arrival_ns, end_ns, last = fused(members, lasts)               # one span per group

Times in Records are LOCAL (the caller maps the reference last arrival to its own clock).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Tuple

from tf_otel import record
from tf_otel.sources import horovod_timeline as tl

HOW = "stamp"  # horovod.arrival: the rank's own timestamp, clock-corrected
# wait / transfer children only for a rank that waited at least this long: spans cost ~0.1 ms
# of CPU each in the OTel SDK and a real model has ~160 tensors a step (docs/guides/HOROVOD.md);
# the wait is on the collective span itself (horovod.wait_ns), which the analyzer reads without
# a child
MIN_CHILD_WAIT_NS = 1_000_000
# one op and dtype, results back within this of the previous tensor's on rank 0: one response
# of Horovod's (a fused response's tensors come back together; the next response takes at least
# one more collective's latency)
FUSE_GAP_NS = 100_000
ATTR_FUSED_TENSORS = "horovod.fused_tensors"  # tensors in one span (completed together)


@dataclass(frozen=True)
class Stamp:
    """What is known of one collective tensor when the graph is built (names, never values)."""

    tensor: str  # Horovod's tensor name (the op's node name; grouped: <name>_<i>of<n>)
    op: str  # allreduce, allgather, broadcast, alltoall, reducescatter
    dtype: Optional[str] = None
    shape: Optional[str] = None
    nbytes: Optional[int] = None
    group: Optional[str] = None  # grouped ops: the op name all its tensors share
    library: str = "horovod"  # whose collective: "horovod", or "tensorflow" (tf.distribute)
    # one of several devices of this process in the collective (MirroredStrategy; replicas of one
    # collective share ``tensor``); None: the process has one device in it
    replica: Optional[int] = None
    # tf.distribute's collectives: the communication implementation asked (auto, ring, nccl);
    # Horovod's come from the process (records_for's ``backend``)
    backend: Optional[str] = None


@dataclass(frozen=True)
class ReplicaSpread:
    """One step's in-process replicas of a collective: how many, which arrived last, and how
    long after the first."""

    replicas: int
    last: int
    spread_ns: int


Found = Tuple[Stamp, int, int, Optional[str]]  # a stamp, its [t0, t1] (ns), its group


def merge_replicas(found: List[Found]) -> Tuple[List[Found], Dict[str, ReplicaSpread]]:
    """The process's own collective from its replicas' stamps (one entry per ``tensor``): it
    arrives with its last replica (the op cannot start before) and ends with its last result;
    the early replicas' wait for the last one is that replica's lateness, on the step's path
    before the collective, not communication."""
    by_tensor: Dict[str, List[Found]] = {}
    out: List[Found] = []
    for entry in found:
        if entry[0].replica is None:
            out.append(entry)
        else:
            by_tensor.setdefault(entry[0].tensor, []).append(entry)
    spreads: Dict[str, ReplicaSpread] = {}
    for tensor, members in by_tensor.items():
        if len({m[0].replica for m in members}) != len(members):
            # one device's namesakes (ops of one name in two nested graphs): no replicas of one
            # collective, kept as they were
            out.extend((replace(m[0], replica=None), *m[1:]) for m in members)
            continue
        first = members[0]
        arrival = max(m[1] for m in members)
        end = max(m[2] for m in members)
        stamp = replace(first[0], replica=None)
        out.append((stamp, arrival, end, first[3]))
        if len(members) > 1:
            last = max(members, key=lambda m: (m[1], -int(m[0].replica or 0)))
            spreads[tensor] = ReplicaSpread(
                len(members), int(last[0].replica or 0), arrival - min(m[1] for m in members)
            )
    return out, spreads


def nbytes(dtype: Optional[str], dims: Optional[List[Optional[int]]]) -> Optional[int]:
    size = tl._DTYPE_BYTES.get(dtype or "")
    if size is None or dims is None or any(d is None for d in dims):
        return None
    n = size
    for d in dims:
        n *= max(int(d or 0), 0)
    return n


def last_arrivals(per_rank: Mapping[int, Mapping[str, int]]) -> Dict[str, Tuple[int, int]]:
    """tensor -> (last arrival, that rank), over the ranks that reported the tensor."""
    last: Dict[str, Tuple[int, int]] = {}
    for rank in sorted(per_rank):
        for tensor, arrival in per_rank[rank].items():
            seen = last.get(tensor)
            if seen is None or arrival > seen[0]:
                last[tensor] = (int(arrival), rank)
    return last


def records_for(
    stamp: Stamp,
    arrival_ns: int,
    end_ns: int,
    last_ns: Optional[int],
    last_rank: Optional[int],
    rank: int,
    step: int,
    key: str,
    group: Optional[str] = None,
    backend: Optional[str] = None,
    min_child_wait_ns: Optional[int] = MIN_CHILD_WAIT_NS,
    spread: Optional[ReplicaSpread] = None,
) -> List[record.Record]:
    """One rank's collective span (LOCAL clock), with wait and transfer children when this rank
    waited at least ``min_child_wait_ns`` for the last one (None: never; the wait is in the
    span's ``horovod.wait_ns`` either way).

    ``last_ns`` (this rank's clock) None: the other ranks' arrivals are not known: no wait
    child, arrival ``unknown``."""
    end_ns = max(end_ns, arrival_ns)
    known = last_ns is not None
    ready = min(max(last_ns if last_ns is not None else arrival_ns, arrival_ns), end_ns)
    wait_ns = ready - arrival_ns
    attributes = {
        tl.ATTR_OP: stamp.op,
        tl.ATTR_TENSOR: stamp.tensor,
        tl.ATTR_LAST: known and last_rank == rank,
        tl.ATTR_WAIT: wait_ns,
        tl.ATTR_ARRIVAL: HOW if known else "unknown",
        record.ATTR_COLLECTIVE_KEY: key,
    }
    for name, value in (
        (tl.ATTR_DTYPE, stamp.dtype),
        (tl.ATTR_SHAPE, stamp.shape),
        (tl.ATTR_BYTES, stamp.nbytes),
        (tl.ATTR_BACKEND, stamp.backend or backend),
        (tl.ATTR_FUSED, group),
        (record.ATTR_REPLICAS, spread.replicas if spread else None),
        (record.ATTR_REPLICA_LAST, spread.last if spread else None),
        (record.ATTR_REPLICA_SPREAD_NS, spread.spread_ns if spread else None),
    ):
        if value is not None:
            attributes[name] = value
    parent = record.Record(
        f"{stamp.library}.{stamp.op} {tl.short_name(stamp.tensor)}",
        arrival_ns,
        end_ns,
        record.COLLECTIVE,
        step=step,
        attributes=attributes,
    )
    out = [parent]
    if min_child_wait_ns is None or wait_ns <= 0 or wait_ns < min_child_wait_ns:
        return out
    if wait_ns > 0:
        out.append(
            record.Record(
                "wait",
                arrival_ns,
                ready,
                record.COLLECTIVE_WAIT,
                step=step,
                attributes={tl.ATTR_WAIT: wait_ns, record.ATTR_COLLECTIVE_KEY: key},
                parent_id=parent.record_id,
            )
        )
    out.append(
        record.Record(
            f"transfer {backend or ''}".strip(),
            ready,
            end_ns,
            record.COLLECTIVE_TRANSFER,
            step=step,
            attributes={record.ATTR_COLLECTIVE_KEY: key},
            parent_id=parent.record_id,
        )
    )
    return out


def completed_together(
    ends: Mapping[str, Tuple[str, Optional[str], int]], gap_ns: int = FUSE_GAP_NS
) -> List[List[str]]:
    """Groups of two or more tensors (one op, one dtype) whose results came back one after
    another within ``gap_ns`` (``ends``: tensor -> (op, dtype, end ns) on one rank): Horovod's
    fused responses, as far as the ends tell. Sorted by end; each group by end."""
    groups: List[List[str]] = []
    current: List[str] = []
    kind: Optional[Tuple[str, Optional[str]]] = None
    previous = 0
    for tensor, (op, dtype, end) in sorted(ends.items(), key=lambda item: item[1][2]):
        if current and ((op, dtype) != kind or end - previous > gap_ns):
            if len(current) > 1:
                groups.append(current)
            current = []
        current.append(tensor)
        kind, previous = (op, dtype), end
    if len(current) > 1:
        groups.append(current)
    return groups


def fused(
    members: List[Tuple[Stamp, int, int]], lasts: List[Optional[Tuple[int, int]]]
) -> Tuple[Stamp, int, int, Optional[Tuple[int, int]]]:
    """One span's stamp and times for tensors that completed together on every rank: this
    rank's arrival is its last member's (a response starts once all its tensors are in), its
    end the last end; the group's last arrival is its members' latest (None where one is not
    known). The name is the first member's, which every rank got from rank 0."""
    stamps = [m[0] for m in members]
    sizes = [s.nbytes for s in stamps if s.nbytes is not None]
    first = stamps[0]
    total = sum(sizes) if len(sizes) == len(stamps) else None
    stamp = Stamp(
        tensor=first.tensor,
        op=first.op,
        dtype=first.dtype,
        nbytes=total,
        library=first.library,
        backend=first.backend,
    )
    arrival = max(m[1] for m in members)
    end = max(m[2] for m in members)
    known = [v for v in lasts if v is not None]
    last = max(known) if len(known) == len(lasts) else None
    return stamp, arrival, end, last
