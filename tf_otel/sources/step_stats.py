"""TF1 ``RunMetadata.step_stats`` (FULL_TRACE) -> ``compute`` and ``transfer`` Records.

Usage (on the export thread; ``step_stats`` is a ``tensorflow.StepStats`` message or any object
with the same fields)::

    from tf_otel.sources.step_stats import step_stats_capped
    records = step_stats_capped(run_metadata.step_stats, step=12, limit=500)

(the same as ``cap_records(step_stats_records(...), 500)``, but only the kept node executions
become Records: the longest are picked from the raw durations first);

- every ``node_stats`` entry becomes a ``compute`` Record: ``tensorflow.op.name``,
  ``tensorflow.op.type`` (from the timeline label ``name = Type(inputs)``), ``tensorflow.device``,
  and the sizes TF reports: ``tensorflow.op.output_bytes`` (outputs' requested bytes),
  ``tensorflow.op.memory.peak_bytes`` / ``.allocator_bytes_in_use`` (its allocators);
- ``RecvTensor`` entries (PS mode: the worker's copy of a remote tensor) become ``transfer``
  Records from their label
  ``[8192B] [129.0Mb/s] edge_5_x/read from /job:ps/... to /job:worker/...``:
  ``tensorflow.transfer.src``, ``.dst``, ``.bytes``, ``.edge``, ``.rate_mbps``;
- times: ``all_start_nanos`` / ``op_end_rel_nanos`` when set, else the ``*_micros`` fields
  (Unix epoch, the local ``time.time_ns`` domain). Only names and sizes, never tensor values.
"""

from __future__ import annotations

import heapq
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence

from tf_otel.record import ATTR_TRANSFER_EDGE, COMPUTE, FRAMEWORK, INPUT, TRANSFER, Record

ATTR_OP_NAME = "tensorflow.op.name"
ATTR_OP_TYPE = "tensorflow.op.type"
ATTR_DEVICE = "tensorflow.device"
ATTR_SRC = "tensorflow.transfer.src"
ATTR_DST = "tensorflow.transfer.dst"
ATTR_BYTES = "tensorflow.transfer.bytes"
ATTR_EDGE = ATTR_TRANSFER_EDGE
ATTR_RATE = "tensorflow.transfer.rate_mbps"
# per-op memory (sizes only): outputs' requested bytes, the op's allocation peak, the allocator's
# bytes in use after the op
ATTR_OUTPUT_BYTES = "tensorflow.op.output_bytes"
ATTR_PEAK_BYTES = "tensorflow.op.memory.peak_bytes"
ATTR_ALLOCATOR_IN_USE = "tensorflow.op.memory.allocator_bytes_in_use"
# the cap's summary (a framework Record spanning the step's op records)
ATTR_OPS_TOTAL = "tf_otel.ops.total"
ATTR_OPS_KEPT = "tf_otel.ops.kept"
ATTR_OPS_DROPPED = "tf_otel.ops.dropped"
ATTR_OPS_DROPPED_NS = "tf_otel.ops.dropped_ns"
ATTR_OPS_TOTAL_NS = "tf_otel.ops.total_ns"
ATTR_OPS_SOURCE = "tf_otel.ops.source"

INPUT_OP_TYPES = frozenset(
    ("IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional", "QueueDequeueV2",
     "QueueDequeueManyV2", "QueueDequeueUpToV2")
)  # fmt: skip
_SKIP = frozenset(("_SOURCE", "_SINK"))
_RECV = re.compile(
    r"^\[(?P<bytes>\d+)B\]\s+\[(?P<rate>[\d.]+)(?P<unit>[KMG]?b)/s\]\s+(?P<edge>\S+)"
    r"\s+from\s+(?P<src>\S+)\s+to\s+(?P<dst>\S+)"
)
_UNIT = {"b": 1e-6, "Kb": 1e-3, "Mb": 1.0, "Gb": 1e3}
_TYPE = re.compile(r"^\s*[^=]*=\s*([A-Za-z0-9_.>-]+)\(")


def parse_recv_label(label: str) -> Optional[Dict[str, Any]]:
    """The transfer attributes of a RecvTensor timeline label, or None if it is not one."""
    m = _RECV.match(label or "")
    if m is None:
        return None
    try:  # "[.Mb/s]", "[1.2.3Mb/s]" or a size of thousands of digits: not a TF label
        nbytes, rate = int(m.group("bytes")), float(m.group("rate"))
    except ValueError:
        return None
    return {
        ATTR_SRC: m.group("src"),
        ATTR_DST: m.group("dst"),
        ATTR_BYTES: nbytes,
        ATTR_EDGE: m.group("edge"),
        ATTR_RATE: rate * _UNIT.get(m.group("unit"), 1.0),
    }


def op_type(label: str, node_name: str) -> str:
    """``MatMul`` from ``MatMul_1 = MatMul(a, b)``; the node's base name if the label has none."""
    m = _TYPE.match(label or "")
    if m is not None:
        return m.group(1)
    return node_name.rsplit("/", 1)[-1].split(":")[0] or "?"


def _record(node: Any, device: str, start: int, end: int, step: Optional[int]) -> Record:
    name = node.node_name
    label = node.timeline_label
    if name == "RecvTensor":
        attrs = parse_recv_label(label)
        if attrs is not None:
            return Record(f"RecvTensor {attrs[ATTR_EDGE]}", start, end, TRANSFER, step, attrs)
    kind = op_type(label, name)
    category = INPUT if kind in INPUT_OP_TYPES else COMPUTE
    attrs = {ATTR_OP_NAME: name, ATTR_OP_TYPE: kind, ATTR_DEVICE: device}
    attrs.update(op_memory(node))
    return Record(f"{name}:{kind}", start, end, category, step, attrs)


def op_memory(node: Any) -> Dict[str, int]:
    """The sizes FULL_TRACE reports for one node execution (absent ones left out): its outputs'
    requested bytes, the peak it allocated and the allocator's bytes in use after it."""
    out: Dict[str, int] = {}
    outputs = sum(
        o.tensor_description.allocation_description.requested_bytes
        for o in getattr(node, "output", ())
    )
    if outputs > 0:
        out[ATTR_OUTPUT_BYTES] = outputs
    memory = list(getattr(node, "memory", ()))
    peak = max((m.peak_bytes for m in memory), default=0)
    if peak > 0:
        out[ATTR_PEAK_BYTES] = peak
    in_use = max((m.allocator_bytes_in_use for m in memory), default=0)
    if in_use > 0:
        out[ATTR_ALLOCATOR_IN_USE] = in_use
    return out


def _raw(step_stats: Any) -> tuple:
    """Parallel lists (starts, ends, devices, nodes) of the node executions worth a Record.
    Times: ``*_nanos`` when set, else ``*_micros``; the op end, else the end of all work."""
    starts: List[int] = []
    ends: List[int] = []
    devices: List[str] = []
    nodes: List[Any] = []
    for dev in step_stats.dev_stats:
        device = dev.device
        for node in dev.node_stats:
            start = node.all_start_nanos or node.all_start_micros * 1000
            if start <= 0 or node.node_name in _SKIP:
                continue
            rel = node.op_end_rel_nanos or node.all_end_rel_nanos
            if not rel:
                rel = (node.op_end_rel_micros or node.all_end_rel_micros) * 1000
            starts.append(start)
            ends.append(start + max(0, rel))
            devices.append(device)
            nodes.append(node)
    return starts, ends, devices, nodes


def step_stats_records(step_stats: Any, step: Optional[int] = None) -> List[Record]:
    """One Record per node execution in ``step_stats`` (all devices), sorted by start."""
    starts, ends, devices, nodes = _raw(step_stats)
    out = [_record(*x, step) for x in zip(nodes, devices, starts, ends)]
    out.sort(key=lambda r: r.start_ns)
    return out


def step_stats_capped(
    step_stats: Any, step: Optional[int], limit: int, source: str = "step_stats"
) -> List[Record]:
    """``cap_records(step_stats_records(...))`` without building the dropped Records: the
    longest ``limit`` node executions are picked from the raw durations (heapq), only those
    become Records; the summary is computed from the raw numbers. Ties: step_stats order."""
    starts, ends, devices, nodes = _raw(step_stats)
    n = len(starts)
    if not n:
        return []
    durations = [e - s for s, e in zip(starts, ends)]
    keep: Sequence[int] = range(n)
    if 0 < limit < n:
        keep = heapq.nlargest(limit, range(n), key=durations.__getitem__)
    kept = [_record(nodes[i], devices[i], starts[i], ends[i], step) for i in keep]
    kept.sort(key=lambda r: r.start_ns)
    total_ns = sum(durations)
    kept_ns = sum(durations[i] for i in keep)
    summary = Record(
        "op trace summary",
        min(starts),
        max(ends),
        FRAMEWORK,
        step,
        _summary(source, n, len(kept), total_ns, total_ns - kept_ns),
    )
    return [summary, *kept]


def _summary(source: str, total: int, kept: int, total_ns: int, dropped_ns: int) -> Dict:
    return {
        ATTR_OPS_SOURCE: source,
        ATTR_OPS_TOTAL: total,
        ATTR_OPS_KEPT: kept,
        ATTR_OPS_DROPPED: total - kept,
        ATTR_OPS_TOTAL_NS: total_ns,
        ATTR_OPS_DROPPED_NS: dropped_ns,
    }


def cap_records(
    records: List[Record], limit: int, step: Optional[int] = None, source: str = "step_stats"
) -> List[Record]:
    """Keep the ``limit`` longest records; add one ``framework`` summary Record (counts and
    totals of all and of the dropped ones) spanning them. ``limit <= 0``: no cap."""
    if not records:
        return records
    total_ns = sum(r.end_ns - r.start_ns for r in records)
    kept = records
    dropped: Iterable[Record] = ()
    if 0 < limit < len(records):
        ranked = sorted(records, key=lambda r: r.end_ns - r.start_ns, reverse=True)
        kept, dropped = ranked[:limit], ranked[limit:]
        kept.sort(key=lambda r: r.start_ns)
    dropped = list(dropped)
    summary = Record(
        "op trace summary",
        min(r.start_ns for r in records),
        max(r.end_ns for r in records),
        FRAMEWORK,
        step,
        _summary(
            source, len(records), len(kept), total_ns, sum(r.end_ns - r.start_ns for r in dropped)
        ),
    )
    return [summary, *kept]
