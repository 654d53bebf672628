"""GPU kernels from a TF profiler XSpace (``/device:GPU:<n>`` planes) as ``kernel`` Records.

Usage::

    from tf_otel.sources.xplane_gpu import gpu_kernel_records, place_under_collectives
    kernels = gpu_kernel_records("logdir/plugins/profile/<ts>/<host>.xplane.pb", step=12)
    place_under_collectives(kernels, collective_records)   # sets parent_id on NCCL kernels

Structure read (TSL xplane.proto / xplane_schema, as the CUPTI collector writes it):

- planes named ``/device:GPU:<n>``; each stream is a line whose name is ``Stream #<id>(...)``
  (its id is the stream id); derived lines ("XLA Ops", "TensorFlow Ops", ...) are skipped;
- an event's ``metadata_id`` names its kernel in ``plane.event_metadata``; its stats name
  their kind through ``plane.stat_metadata`` (``correlation_id``, ``device_id``,
  ``context_id``, ``kernel_details``, ``stream``, ``tf_op``, ``annotation``...);
- time: epoch_ns = ``profile_start_time`` stat of the "Task Environment" plane (else
  ``base_ns``) + ``line.timestamp_ns`` + ``event.offset_ps // 1000``.

Kernels XLA launched (JAX, TF with ``jit_compile``) carry ``tf_op`` = "XlaModule:" (the module's
annotation, not an op) and ``hlo_module`` / ``hlo_op`` / ``name`` (the op_name metadata): they
become ``xla.hlo_module``, ``xla.hlo_op``, ``xla.op_name``, and no ``tensorflow.op.name``.
Checked on a real capture: JAX 0.11.2 on an H100 (tests/nccl/fixtures/h100/).

Memcpy / memset activities (no ``kernel_details``, not an NCCL name) are not kernels: skipped.
TensorFlow is imported only when an XSpace is parsed (tf_otel.sources.xplane, for its schema).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from tf_otel.nccl.kernels import parse_kernel_name
from tf_otel.record import ATTR_COLLECTIVE_KEY, ATTR_TENSOR, COLLECTIVE, KERNEL, Record
from tf_otel.sources.horovod_timeline import ATTR_BYTES
from tf_otel.sources.xplane import parse_xspace, stat_value, time_base_ns

log = logging.getLogger(__name__)

# bounded digit counts: int() of thousands of digits raises (CPython's int_max_str_digits)
GPU_PLANE = re.compile(r"^/device:GPU:(\d{1,9})$")
STREAM_LINE = re.compile(r"^Stream #(\d{1,20})(?!\d)")
TASK_ENV_PLANE = "Task Environment"
MAX_EVENTS = 200_000
XLA_MODULE = "XlaModule:"  # tf_op of kernels XLA launched (JAX; TF with jit_compile)

_stats = {"skipped_lines": 0, "dropped_events": 0}
_warned = [False]


def load_xspace(src: Union[str, bytes, Any]) -> Any:
    """An XSpace from a path, serialized bytes, or an XSpace (returned as is). Parsed leniently:
    real profiler output holds strings that are not UTF-8 (see tf_otel.sources.xplane)."""
    if not isinstance(src, (str, bytes)):
        return src
    if isinstance(src, str):
        with open(src, "rb") as f:
            data = f.read()
        try:
            return parse_xspace(data)
        except ValueError as e:
            raise ValueError(f"{src}: {e}") from e
    return parse_xspace(src)


def _stat_value(stat: Any, stat_md: Any) -> Any:
    if stat.WhichOneof("value") == "bytes_value":
        return stat.bytes_value.decode("utf-8", "replace")
    return stat_value(stat, stat_md)


def _stats_of(stats: Iterable[Any], stat_md: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for st in stats:
        md = stat_md.get(st.metadata_id)
        if md is not None and md.name:
            out[md.name] = _stat_value(st, stat_md)
    return out


def profile_start_ns(space: Any) -> Optional[int]:
    """The ``profile_start_time`` stat of the "Task Environment" plane (TF >= 2.16)."""
    for plane in space.planes:
        if plane.name == TASK_ENV_PLANE:
            v = _stats_of(plane.stats, plane.stat_metadata).get("profile_start_time")
            if isinstance(v, int) and v > 0:
                return v
    return None


def gpu_kernel_records(
    src: Union[str, bytes, Any],
    step: Optional[int] = None,
    base_ns: Optional[int] = None,
    rank: Optional[int] = None,
    max_events: int = MAX_EVENTS,
) -> List[Record]:
    """One ``kernel`` Record per kernel event on every GPU plane, sorted by start.

    base_ns: the epoch time of profile start when the XSpace has no "Task Environment"
    plane (TF <= 2.15: take time.time_ns() just before starting the profiler).
    """
    space = load_xspace(src)
    base = time_base_ns(space, base_ns)
    out: List[Record] = []
    dropped = 0
    for plane in space.planes:
        m = GPU_PLANE.match(plane.name)
        if not m:
            continue
        device = int(m.group(1))
        ev_md, st_md = plane.event_metadata, plane.stat_metadata
        for line in plane.lines:
            sm = STREAM_LINE.match(line.name)
            if not sm:
                _stats["skipped_lines"] += 1
                continue
            stream = int(sm.group(1))
            for ev in line.events:
                if len(out) >= max_events:
                    dropped += 1
                    continue
                rec = _kernel_record(ev, ev_md, st_md, base, line.timestamp_ns, device, stream)
                if rec is not None:
                    rec.step = step
                    if rank is not None:
                        rec.attributes["tf_otel.rank"] = rank
                    out.append(rec)
    if dropped:
        _stats["dropped_events"] += dropped
        if not _warned[0]:
            _warned[0] = True
            log.warning("xplane_gpu: kernel events over max_events=%d dropped", max_events)
    out.sort(key=lambda r: r.start_ns)
    return out


def _kernel_record(
    ev: Any, ev_md: Any, st_md: Any, base: int, line_ts: int, device: int, stream: int
) -> Optional[Record]:
    md = ev_md.get(ev.metadata_id)
    name = (md.display_name or md.name) if md is not None else ""
    stats = _stats_of(ev.stats, st_md)
    if md is not None and md.stats:
        stats = {**_stats_of(md.stats, st_md), **stats}
    nccl = parse_kernel_name(name) if name else None
    if nccl is None and "kernel_details" not in stats:
        return None  # memcpy / memset / unknown activity
    start = base + line_ts + ev.offset_ps // 1000
    attrs: Dict[str, Any] = {"gpu.device": device, "gpu.stream": stream}
    if nccl is not None:
        attrs.update(nccl.attributes())
    if str(stats.get("tf_op", "")).startswith(XLA_MODULE):
        del stats["tf_op"]  # an XLA module's annotation, not a TF op: the HLO op says more
    elif "hlo_op" not in stats:
        stats.pop("name", None)
    for key, attr in (
        ("correlation_id", "gpu.correlation_id"),
        ("context_id", "gpu.context_id"),
        ("kernel_details", "gpu.kernel_details"),
        ("tf_op", "tensorflow.op.name"),
        ("annotation", "gpu.annotation"),
        ("hlo_module", "xla.hlo_module"),
        ("hlo_op", "xla.hlo_op"),
        ("name", "xla.op_name"),
    ):
        v = stats.get(key)
        if v is not None and v != "":
            attrs[attr] = v
    if isinstance(stats.get("device_id"), int):
        attrs["gpu.device"] = stats["device_id"]
    return Record(
        name=name or "kernel",
        start_ns=start,
        end_ns=start + ev.duration_ps // 1000,
        category=KERNEL,
        attributes=attrs,
    )


def _overlap(a: Record, b: Record, slack_ns: int) -> int:
    return min(a.end_ns, b.end_ns + slack_ns) - max(a.start_ns, b.start_ns)


def _names_of(c: Record) -> Tuple[str, ...]:
    names = []
    for key in (ATTR_TENSOR, "tensorflow.op.name", ATTR_COLLECTIVE_KEY):
        v = c.attributes.get(key)
        if isinstance(v, str) and v:
            names.append(v)
    return tuple(names)


def place_under_collectives(
    kernels: List[Record], collectives: Iterable[Record], slack_ns: int = 0
) -> int:
    """Set ``parent_id`` of each NCCL kernel Record to the rank's collective Record that
    launched it: among the collectives overlapping it in time (the collective's end extended
    by ``slack_ns``), the one named in the kernel's TF op / annotation, else one of the same
    size (``nccl.bytes`` = ``horovod.bytes``), else the one with the largest overlap (ties: the
    later start, i.e. the innermost). Non-NCCL kernels keep their parent (the step). Returns
    how many kernels were placed. Kernels from XSpaces and from the NCCL profiler plugin's ring
    alike (the exporter places a step's ring collectives under TF's / Horovod's spans)."""
    colls = sorted((c for c in collectives if c.category == COLLECTIVE), key=lambda c: c.start_ns)
    placed = 0
    for kr in kernels:
        if "nccl.collective" not in kr.attributes:
            continue
        hint = " ".join(
            str(kr.attributes.get(a, "")) for a in ("tensorflow.op.name", "gpu.annotation")
        )
        size = str(kr.attributes.get("nccl.bytes", ""))
        best: Optional[Tuple[int, int, int, int, Record]] = None
        for c in colls:
            if c.start_ns > kr.end_ns:
                break
            ov = _overlap(kr, c, slack_ns)
            if ov < 0 or (ov == 0 and kr.end_ns > kr.start_ns):
                continue
            named = int(any(n in hint for n in _names_of(c)))
            same = int(bool(size) and str(c.attributes.get(ATTR_BYTES, "")) == size)
            cand = (named, same, ov, c.start_ns, c)
            if best is None or cand[:4] > best[:4]:
                best = cand
        if best is not None:
            kr.parent_id = best[4].record_id
            if kr.step is None:
                kr.step = best[4].step
            placed += 1
    return placed


def stats() -> Dict[str, int]:
    """Counters: GPU-plane lines skipped (not streams), kernel events dropped over the limit."""
    return dict(_stats)
