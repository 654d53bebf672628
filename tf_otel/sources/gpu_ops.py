"""GPU kernels grouped under the TensorFlow ops that launched them.

Usage::

    from tf_otel.sources.gpu_ops import group_kernels_by_op, cap_op_tree
    kernels = gpu_kernel_records(space, step=12, base_ns=base)
    records = host_records(space, 12, base) + group_kernels_by_op(kernels, step=12)
    kept = cap_op_tree(records, limit=500, step=12)

On a GPU, TensorFlow's profiler records no per-op host event (TF 2.21 on an H200: the executor
threads hold the kernels' launches and allocations, not ``name:Type`` op events); an op's work
is the kernels it launched, which CUPTI names with the op (``tf_op`` = ``<op name>:<op type>``,
``tensorflow.op.name`` on the kernel Record). Each run of consecutive kernels of one op on one
stream becomes that op's Record: category ``compute``, from its first kernel's start to its last
kernel's end, ``tensorflow.op.name`` / ``tensorflow.op.type`` as the host's op Records carry
them and ``tensorflow.device`` = ``/device:GPU:<n>``; its kernels become its children. Kernels
with no TF op (XLA modules, NCCL) stay as they were (children of the step, or of a collective).

``cap_op_tree`` keeps the longest ops and, under the ops it kept, the longest kernels: half the
budget each when there are more kernels than that, so neither crowds the other out.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from tf_otel.record import COMPUTE, KERNEL, Record
from tf_otel.sources.step_stats import (
    ATTR_DEVICE,
    ATTR_OP_NAME,
    ATTR_OP_TYPE,
    ATTR_OPS_DROPPED,
    ATTR_OPS_DROPPED_NS,
    ATTR_OPS_KEPT,
    ATTR_OPS_TOTAL,
    ATTR_OPS_TOTAL_NS,
    cap_records,
)
from tf_otel.sources.xplane_gpu import XLA_MODULE


def _op_of(kernel: Record) -> Optional[Tuple[str, str]]:
    value = kernel.attributes.get(ATTR_OP_NAME)  # on a kernel: "<op name>:<op type>" (tf_op)
    if kernel.category != KERNEL or kernel.parent_id is not None or not isinstance(value, str):
        return None
    if value.startswith(XLA_MODULE):
        return None
    name, sep, kind = value.rpartition(":")
    return (name, kind) if sep and name and kind else None


def group_kernels_by_op(kernels: List[Record], step: Optional[int] = None) -> List[Record]:
    """The kernels, each run of one op's kernels on a stream under a new op Record (returned
    first, then every kernel: parent ids set on the grouped ones)."""
    streams: Dict[Tuple[str, str], List[Tuple[Record, Tuple[str, str]]]] = {}
    for k in kernels:
        op = _op_of(k)
        if op is not None:
            key = (str(k.attributes.get("gpu.device", "0")), str(k.attributes.get("gpu.stream")))
            streams.setdefault(key, []).append((k, op))
    ops: List[Record] = []
    for (device, stream), items in streams.items():
        items.sort(key=lambda item: item[0].start_ns)
        current: Optional[Record] = None
        current_op: Optional[Tuple[str, str]] = None
        for k, op in items:
            if current is None or op != current_op:
                name, kind = op
                attrs = {
                    ATTR_OP_NAME: name,
                    ATTR_OP_TYPE: kind,
                    ATTR_DEVICE: f"/device:GPU:{device}",
                    "gpu.stream": stream,
                }
                current = Record(f"{name}:{kind}", k.start_ns, k.end_ns, COMPUTE, step, attrs)
                current_op = op
                ops.append(current)
            current.end_ns = max(current.end_ns, k.end_ns)
            k.parent_id = current.record_id
    ops.sort(key=lambda r: r.start_ns)
    return ops + kernels


def cap_op_tree(records: List[Record], limit: int, step: Optional[int] = None) -> List[Record]:
    """``cap_records`` over everything but grouped kernels; then the longest kernels under the
    ops kept, up to ``limit`` in all. ``limit <= 0``: no cap."""
    grouped = [r for r in records if r.category == KERNEL and r.parent_id is not None]
    if not grouped or limit <= 0 or len(records) <= limit:
        return cap_records(records, limit, step, "xspace")
    grouped_ids = {id(r) for r in grouped}
    rest = [r for r in records if id(r) not in grouped_ids]
    kept = cap_records(rest, max(limit // 2, limit - len(grouped)), step, "xspace")
    kept_ids = {r.record_id for r in kept}
    room = max(0, limit - (len(kept) - 1))  # the summary Record is not counted
    children = sorted(
        (r for r in grouped if r.parent_id in kept_ids),
        key=lambda r: r.end_ns - r.start_ns,
        reverse=True,
    )[:room]
    children.sort(key=lambda r: r.start_ns)
    summary = kept[0].attributes  # the counts cover the kernels too
    took = {id(r) for r in children}
    summary[ATTR_OPS_TOTAL] += len(grouped)
    summary[ATTR_OPS_KEPT] += len(children)
    summary[ATTR_OPS_DROPPED] += len(grouped) - len(children)
    summary[ATTR_OPS_TOTAL_NS] += sum(r.end_ns - r.start_ns for r in grouped)
    summary[ATTR_OPS_DROPPED_NS] += sum(r.end_ns - r.start_ns for r in grouped if id(r) not in took)
    return kept + children
