"""Horovod collectives from each rank's own timestamps -> per-rank collective Records.

Every rank times, inside its own graph, when it handed a tensor to Horovod (its arrival) and
when the result came back (its end). Gathered on rank 0 (reference clock), the last arrival of
each collective is known exactly for any number of ranks, whatever Horovod's response cache
does; each rank then splits its collective into waiting for the last rank and the rest
(negotiation and data movement).

Usage::

    last = last_arrivals({rank: {tensor: arrival_ref_ns, ...}, ...})   # tensor -> (ns, rank)
    records = records_for(stamp, arrival_ns, end_ns, last_ns, last_rank, rank, step, key, group)

Times in Records are LOCAL (the caller maps the reference last arrival to its own clock).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from tf_otel import record
from tf_otel.sources import horovod_timeline as tl

HOW = "stamp"  # horovod.arrival: the rank's own timestamp, clock-corrected
# wait / transfer children only for a rank that waited at least this long: spans cost ~0.1 ms of
# CPU each in the OTel SDK and a real model has ~160 tensors a step (docs/HOROVOD.md); the wait
# is on the collective span itself (horovod.wait_ns), which the analyzer reads without a child
MIN_CHILD_WAIT_NS = 1_000_000


@dataclass(frozen=True)
class Stamp:
    """What is known of one collective tensor when the graph is built (names, never values)."""

    tensor: str  # Horovod's tensor name (the op's node name; grouped: <name>_<i>of<n>)
    op: str  # allreduce, allgather, broadcast, alltoall, reducescatter
    dtype: Optional[str] = None
    shape: Optional[str] = None
    nbytes: Optional[int] = None
    group: Optional[str] = None  # grouped ops: the op name all its tensors share


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
        (tl.ATTR_BACKEND, backend),
        (tl.ATTR_FUSED, group),
    ):
        if value is not None:
            attributes[name] = value
    parent = record.Record(
        f"horovod.{stamp.op} {tl.short_name(stamp.tensor)}",
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
