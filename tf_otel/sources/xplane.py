"""TF2 profiler XSpace (host plane) -> ``compute`` / ``input`` / ``framework`` Records.

Usage (on the export thread)::

    from tf_otel.sources.xplane import parse_xspace, host_records
    space = parse_xspace(open("logdir/plugins/profile/<ts>/<host>.xplane.pb", "rb").read())
    records = host_records(space, step=10)

What becomes a Record (``/host:CPU`` plane, every thread line):

- op events, named ``<op name>:<Type>`` with display name ``<Type>`` -> ``compute``
  (``tensorflow.op.name``, ``tensorflow.op.type``, ``tensorflow.device``);
- ``IteratorGetNextOp::DoCompute`` (and ops of an input type) -> ``input``;
- tf.function runs (events carrying a ``tf_function_call`` stat) -> ``framework``
  (``tensorflow.function.name``).

Time base: ``profile_start_time`` of the "Task Environment" plane (TF >= 2.16, epoch ns) else
``base_ns``; event start = base + line.timestamp_ns + offset_ps // 1000.

The profiler writes strings that are not always valid UTF-8 (thread / resource names), which
the strict proto3 ``xplane_pb2`` parser rejects: ``parse_xspace`` uses a proto2 copy of the same
schema (no UTF-8 check). TensorFlow is imported only on first use.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from tf_otel.record import ATTR_FUNCTION_NAME, COMPUTE, FRAMEWORK, INPUT, Record
from tf_otel.sources.step_stats import (
    ATTR_DEVICE,
    ATTR_OP_NAME,
    ATTR_OP_TYPE,
    INPUT_OP_TYPES,
)

HOST_PLANE = "/host:CPU"
TASK_ENV_PLANE = "Task Environment"
INPUT_EVENTS = frozenset(("IteratorGetNextOp::DoCompute", "IteratorGetNextAsOptionalOp::DoCompute"))
_lax_class: List[Any] = []


def _lax_xspace_class() -> Any:
    if _lax_class:
        return _lax_class[0]
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    fdp = descriptor_pb2.FileDescriptorProto()
    xplane_pb2.DESCRIPTOR.CopyToProto(fdp)
    old = f".{fdp.package}."
    fdp.syntax, fdp.name, fdp.package = "proto2", "tf_otel_lax_xplane.proto", "tf_otel_lax"

    def retarget(message: Any) -> None:
        for f in message.field:
            if f.type_name.startswith(old):
                f.type_name = ".tf_otel_lax." + f.type_name[len(old) :]
        for nested in message.nested_type:
            retarget(nested)

    for message in fdp.message_type:
        retarget(message)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    _lax_class.append(
        message_factory.GetMessageClass(pool.FindMessageTypeByName("tf_otel_lax.XSpace"))
    )
    return _lax_class[0]


def parse_xspace(data: bytes) -> Any:
    """An XSpace message from serialized bytes (UTF-8-lenient)."""
    space = _lax_xspace_class()()
    try:
        space.ParseFromString(data)
    except Exception as exc:  # noqa: BLE001 - DecodeError
        raise ValueError(f"{len(data)} bytes: not a serialized XSpace ({exc})") from exc
    return space


def stat_value(stat: Any, stat_md: Any) -> Any:
    """An XStat's value; a ref_value resolved to the referenced stat metadata's name."""
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    if kind == "ref_value":
        md = stat_md.get(stat.ref_value)
        return md.name if md is not None else None
    return getattr(stat, kind)


def profile_start_ns(space: Any) -> Optional[int]:
    for plane in space.planes:
        if plane.name == TASK_ENV_PLANE:
            for st in plane.stats:
                md = plane.stat_metadata.get(st.metadata_id)
                if md is not None and md.name == "profile_start_time":
                    value = stat_value(st, plane.stat_metadata)
                    if isinstance(value, int) and value > 0:
                        return value
    return None


def time_base_ns(space: Any, base_ns: Optional[int] = None) -> int:
    """Epoch ns of the profile start: the Task Environment plane's, else the caller's."""
    base = profile_start_ns(space)
    if base is not None:
        return base
    if base_ns is None:
        raise ValueError(
            "XSpace has no 'Task Environment' profile_start_time: pass base_ns "
            "(time.time_ns() taken just before the profiler started)"
        )
    return base_ns


def host_records(
    space: Any, step: Optional[int] = None, base_ns: Optional[int] = None
) -> List[Record]:
    """Records of the host plane's op, input and tf.function events, sorted by start."""
    base = time_base_ns(space, base_ns)
    out: List[Record] = []
    for plane in space.planes:
        if plane.name != HOST_PLANE:
            continue
        ev_md, st_md = plane.event_metadata, plane.stat_metadata
        function_stat = next((k for k, md in st_md.items() if md.name == "tf_function_call"), None)
        kinds: Dict[int, Any] = {}  # metadata id -> (category, name, type) or None
        for line in plane.lines:
            line_base = base + line.timestamp_ns
            for ev in line.events:
                kind = kinds.get(ev.metadata_id, ())
                if kind == ():
                    kind = kinds[ev.metadata_id] = _classify(ev_md.get(ev.metadata_id))
                if kind is None:
                    if function_stat is None or not any(
                        s.metadata_id == function_stat for s in ev.stats
                    ):
                        continue
                    md = ev_md.get(ev.metadata_id)
                    kind = (FRAMEWORK, md.name if md is not None else "function", None)
                start = line_base + ev.offset_ps // 1000
                end = start + ev.duration_ps // 1000
                category, name, op_kind = kind
                if category == FRAMEWORK:
                    attrs = {ATTR_FUNCTION_NAME: name}
                    out.append(Record(f"tf.function {name}", start, end, FRAMEWORK, step, attrs))
                elif op_kind is None:
                    out.append(Record(name, start, end, INPUT, step, {ATTR_DEVICE: HOST_PLANE}))
                else:
                    attrs = {ATTR_OP_NAME: name, ATTR_OP_TYPE: op_kind, ATTR_DEVICE: HOST_PLANE}
                    out.append(Record(f"{name}:{op_kind}", start, end, category, step, attrs))
    out.sort(key=lambda r: r.start_ns)
    return out


def _classify(md: Any) -> Optional[tuple]:
    """(category, op name, op type) for an op / input event metadata; None for others."""
    if md is None:
        return None
    name = md.name
    if name in INPUT_EVENTS:
        return (INPUT, name, None)
    display = md.display_name
    if display and name.endswith(":" + display) and len(name) > len(display) + 1:
        op_name = name[: -len(display) - 1]
        return (INPUT if display in INPUT_OP_TYPES else COMPUTE, op_name, display)
    return None
