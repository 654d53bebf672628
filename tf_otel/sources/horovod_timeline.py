"""Horovod timeline (Chrome-trace JSON written by rank 0) -> per-rank collective Records.

The file is read incrementally while Horovod writes it (it is invalid JSON until closed: a
trailing array with no ``]``); truncated or corrupt parts are skipped and counted, never raised.

Usage::

    reader = TimelineReader(path)
    parser = TimelineParser()
    for event in reader.poll():            # new complete events since the last poll
        parser.feed(event)
    done = parser.take()                   # finished Collectives (times: us since the epoch)
    assign_fused_groups(done)
    for c in done:
        seen = negotiation(c, world_size, 3000.0, began={rank: step start us}, opened=file us)
        for rank in range(world_size):
            view = rank_view(c, rank, world_size, negotiated=seen)  # arrival / wait / last flag

Per tensor the timeline has: NEGOTIATE_<OP> (B..E), per-rank "X" ticks named by rank (the moment
that rank became ready; only on response-cache misses), then <OP> (B..E, E carries dtype / shape)
with children such as MEMCPY_IN_FUSION_BUFFER, GLOO_ALLREDUCE / MPI_ALLREDUCE / NCCL_ALLREDUCE,
MEMCPY_OUT_FUSION_BUFFER. Only rank 0 writes it. On a cache miss NEGOTIATE B is the first request
the coordinator counted and each rank has its tick. On a cache hit (every step after the first,
by default) B is written in the first cycle in which ANY rank had the request queued (Horovod
0.28.1 marks hits on any worker for the timeline: CacheCoordinator::sync, timeline_bits) and E
once every rank had it: the first and the last arrival, never which rank was which. A late
rank 0 and a late rank 1 write the same events; ``negotiation`` tells them apart only where the
ranks' step starts do (a rank that began its step after B did not start it), else the ranks'
arrivals stay ``unknown``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from tf_otel import record
from tf_otel.health import count

OPS = {
    "ALLREDUCE": "allreduce",
    "ADASUM": "allreduce",
    "ALLGATHER": "allgather",
    "BROADCAST": "broadcast",
    "ALLTOALL": "alltoall",
    "REDUCESCATTER": "reducescatter",
}
BACKENDS = ("GLOO", "MPI", "NCCL", "CCL", "DDL", "ADASUM_MPI")
_DTYPE_BYTES = {
    "uint8": 1,
    "int8": 1,
    "bool": 1,
    "uint16": 2,
    "int16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "float32": 4,
    "int64": 8,
    "float64": 8,
}
_READ_CHUNK = 1 << 20
_MAX_PENDING = 1 << 16  # an undecodable prefix longer than this is garbage, not a partial write
_EVENT_START = re.compile(r'\{"(?:ph|name)"')
_MAX_US = 2**63 / 1000 / 2  # Record times are int64 ns; half of it leaves room for clock shifts

# attribute keys (docs/ARCHITECTURE.md, collective)
ATTR_OP = "horovod.op"
ATTR_TENSOR = record.ATTR_TENSOR
ATTR_DTYPE = "horovod.dtype"
ATTR_SHAPE = "horovod.shape"
ATTR_BYTES = "horovod.bytes"
ATTR_BACKEND = "horovod.backend"
ATTR_FUSED = "horovod.fused_group"
ATTR_LAST = record.ATTR_LAST_ARRIVAL
ATTR_WAIT = record.ATTR_WAIT_NS
ATTR_ARRIVAL = record.ATTR_ARRIVAL

# A rank whose step began more than this after NEGOTIATE started did not start it. The slack
# covers the clocks: another rank's step start comes through the clock sync (docs/guides/CLOCK.md);
# rank 0's timeline is its steady clock from the wall time at hvd.init(), which NTP slews alike.
BEGAN_SLACK_US = 2000.0
# Horovod writes nothing while no timeline file is open: a request already queued when the file
# opens gets its NEGOTIATE start in the first cycle after (1 ms by default), so a start this
# close after the opening may be the opening, with the first arrival earlier.
OPENED_SLACK_US = 2000.0


def _time_us(base_us: float, value: Any) -> float:
    """``base_us + value`` (us); ValueError unless finite and within int64 ns (it becomes one)."""
    us = base_us + float(value)
    if not -_MAX_US < us < _MAX_US:  # also False for NaN
        raise ValueError(f"timestamp {value!r} out of range")
    return us


class TimelineReader:
    """Yields complete JSON events appended to a timeline file since the previous poll."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self._buffer = ""
        self._decoder = json.JSONDecoder()
        self.garbage = 0  # skipped undecodable stretches

    def poll(self, final: bool = False) -> List[Dict[str, Any]]:
        """New events; ``final``: the writer is gone, so an undecodable tail is dropped."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(_READ_CHUNK)
                while data:
                    self.offset += len(data)
                    self._buffer += data.decode("utf-8", "replace")
                    data = f.read(_READ_CHUNK) if len(self._buffer) < 8 * _READ_CHUNK else b""
        except OSError:
            count("horovod_timeline_unreadable")
            return []
        return list(self._decode(final))

    def _decode(self, final: bool) -> Iterator[Dict[str, Any]]:
        text, pos, end = self._buffer, 0, len(self._buffer)
        while pos < end:
            while pos < end and text[pos] in " \t\r\n,[]":
                pos += 1
            if pos >= end:
                break
            try:
                event, next_pos = self._decoder.raw_decode(text, pos)
            except (ValueError, RecursionError) as error:
                partial = not isinstance(error, RecursionError)  # too deep: never valid
                if partial and not final and end - pos < _MAX_PENDING:
                    break  # most likely a partial write: wait for more
                match = _EVENT_START.search(text, pos + 1)
                self.garbage += 1
                count("horovod_timeline_garbage")
                if match is None:
                    pos = end
                    break
                pos = match.start()
                continue
            pos = next_pos
            if isinstance(event, dict):
                yield event
            else:
                self.garbage += 1
        self._buffer = text[pos:]


@dataclass
class Collective:
    """One tensor's collective as rank 0 saw it; times in microseconds since the Unix epoch."""

    tensor: str
    op: str = "allreduce"
    negotiate_start: Optional[float] = None
    negotiate_end: Optional[float] = None
    ticks: Dict[int, float] = field(default_factory=dict)  # rank -> ready time
    op_start: Optional[float] = None
    op_end: Optional[float] = None
    transfer_start: Optional[float] = None  # the backend phase (GLOO_ALLREDUCE ...)
    transfer_end: Optional[float] = None
    backend: Optional[str] = None
    fused: bool = False  # went through the fusion buffer
    dtype: Optional[str] = None
    shape: Optional[str] = None
    fused_group: Optional[int] = None

    @property
    def nbytes(self) -> Optional[int]:
        size = _DTYPE_BYTES.get(self.dtype or "")
        if size is None or self.shape is None:
            return None
        try:
            dims = [int(d) for d in self.shape.strip("[]()").replace(" ", "").split(",") if d]
        except ValueError:
            return None
        n = 1
        for d in dims:
            n *= max(d, 0)
        return n * size

    @property
    def last_ready(self) -> Optional[float]:
        """When the last rank became ready: its tick, else the end of negotiation."""
        if self.ticks:
            return max(self.ticks.values())
        return self.negotiate_end if self.negotiate_end is not None else self.op_start


class TimelineParser:
    """Turns a stream of timeline events into finished Collectives (bounded state)."""

    def __init__(self, max_open: int = 65536) -> None:
        self.epoch_us: Optional[float] = None
        self.names: Dict[int, str] = {}
        self._open: Dict[int, Collective] = {}  # pid -> collective in progress
        self._stack: Dict[int, List[str]] = {}  # pid -> open B phase names
        self._done: List[Collective] = []
        self.max_open = max_open
        # tensor name -> (collective, open phases) still in progress when the previous file of
        # the same writer ended (``continue_from``): claimed by the pid the name gets here
        self._carried: Dict[str, Tuple[Collective, List[str]]] = {}

    def continue_from(self, previous: TimelineParser) -> None:
        """Read this file as the continuation of ``previous``'s: Horovod switched files without
        a gap (``start_timeline`` while one runs), so a collective whose NEGOTIATE began there
        ends here. Pids are per file (the writer numbers tensors anew), so the collectives in
        progress are carried by tensor name."""
        for pid, current in previous._open.items():
            name = previous.names.get(pid)
            if name is not None:
                self._carried[name] = (current, previous._stack.get(pid, []))
        previous._open.clear()
        if self.epoch_us is None:
            self.epoch_us = previous.epoch_us

    def feed(self, event: Dict[str, Any]) -> None:
        try:
            self._feed(event)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
            count("horovod_timeline_bad_event")

    def _feed(self, event: Dict[str, Any]) -> None:
        ph = event.get("ph")
        pid = event.get("pid")
        if ph == "M":
            args = event.get("args") or {}
            if "start_time_since_epoch_in_micros" in args:
                self.epoch_us = _time_us(0.0, args["start_time_since_epoch_in_micros"])
            elif event.get("name") == "process_name" and "name" in args and pid is not None:
                name = self.names[int(pid)] = str(args["name"])
                carried = self._carried.pop(name, None) if self._carried else None
                if carried is not None:
                    self._open[int(pid)], self._stack[int(pid)] = carried
            return
        if pid is None or self.epoch_us is None:
            return
        pid = int(pid)
        ts = _time_us(self.epoch_us, event["ts"])
        stack = self._stack.setdefault(pid, [])
        if ph == "B":
            name = str(event.get("name", ""))
            if not stack:
                self._begin_top(pid, name, ts)
            else:
                self._begin_child(pid, name, ts)
            stack.append(name)
        elif ph == "E":
            if not stack:
                count("horovod_timeline_unmatched_end")
                return
            name = stack.pop()
            self._end(pid, name, ts, event.get("args") or {}, top=not stack)
        elif ph == "X":
            current = self._open.get(pid)
            if current is not None and str(event.get("name", "")).isdigit():
                current.ticks.setdefault(int(event["name"]), ts)

    def _collective(self, pid: int) -> Collective:
        current = self._open.get(pid)
        if current is None:
            if len(self._open) >= self.max_open:
                count("horovod_timeline_open_dropped")
                self._open.pop(next(iter(self._open)))
            current = Collective(tensor=self.names.get(pid, f"tensor {pid}"))
            self._open[pid] = current
        return current

    def _begin_top(self, pid: int, name: str, ts: float) -> None:
        if name.startswith("NEGOTIATE_"):
            stale = self._open.pop(pid, None)
            if stale is not None:
                count("horovod_timeline_incomplete")
            current = self._collective(pid)
            current.op = OPS.get(name[len("NEGOTIATE_") :], name[len("NEGOTIATE_") :].lower())
            current.negotiate_start = ts
        elif name in OPS or name.isupper():
            current = self._collective(pid)
            current.op = OPS.get(name, current.op)
            current.op_start = ts

    def _begin_child(self, pid: int, name: str, ts: float) -> None:
        current = self._open.get(pid)
        if current is None:
            return
        if "FUSION_BUFFER" in name:
            current.fused = current.fused or name.startswith("MEMCPY_IN")
            return
        for backend in BACKENDS:
            if name.startswith(backend + "_"):
                current.backend = backend.split("_")[-1].lower()
                if current.transfer_start is None:
                    current.transfer_start = ts
                return

    def _end(self, pid: int, name: str, ts: float, args: Dict[str, Any], top: bool) -> None:
        current = self._open.get(pid)
        if current is None:
            return
        if top and name.startswith("NEGOTIATE_"):
            current.negotiate_end = ts
        elif top:
            current.op_end = ts
            current.dtype = str(args["dtype"]) if "dtype" in args else current.dtype
            current.shape = str(args["shape"]) if "shape" in args else current.shape
            if current.op_start is None:
                current.op_start = ts
            self._done.append(self._open.pop(pid))
        elif any(name.startswith(b + "_") for b in BACKENDS):
            current.transfer_end = ts

    def take(self) -> List[Collective]:
        """Collectives finished since the last call."""
        done, self._done = self._done, []
        return done


def assign_fused_groups(collectives: List[Collective], slack_us: float = 50.0) -> None:
    """Tensors fused into one transfer share its backend phase: same start and end (± slack)."""
    fused = sorted(
        (c for c in collectives if c.fused and c.transfer_start is not None),
        key=lambda c: (c.transfer_start, c.transfer_end or 0),
    )
    group, anchor = 0, None
    for c in fused:
        if (
            anchor is None
            or abs(c.transfer_start - anchor.transfer_start) > slack_us  # type: ignore[operator]
            or abs((c.transfer_end or 0) - (anchor.transfer_end or 0)) > slack_us
        ):
            group += 1
            anchor = c
        c.fused_group = group


@dataclass
class RankView:
    """One rank's part of a collective (us since the epoch, rank 0's clock)."""

    arrival: float
    last_ready: float
    end: float
    transfer_start: float
    last_arrival: bool
    how: str  # tick | negotiate | inferred | unknown


@dataclass(frozen=True)
class Negotiation:
    """What a response-cache hit's NEGOTIATE phase says of the ranks, where their step starts
    tell who was who: ``first`` arrived at its start (or before, where that was when the file
    opened: its wait is then at least the phase), ``last`` at its end; ``together``: every rank
    was ready within the threshold of the first (each read at its end, no wait). All None /
    False: the timeline does not say when any rank arrived between start and end."""

    first: Optional[int] = None
    last: Optional[int] = None
    together: bool = False


def negotiation(
    c: Collective,
    world_size: int,
    wait_threshold_us: float,
    began: Optional[Mapping[int, float]] = None,
    opened: Optional[float] = None,
) -> Negotiation:
    """Who arrived first / last at a collective without ticks (a response-cache hit).

    ``began``: ranks' step starts (us since the epoch, rank 0's clock; missing ranks unknown);
    ``opened``: when the timeline file began to be written (None: long before). NEGOTIATE starts
    with the first arrival of ANY rank, not rank 0's (module docstring), so the first rank is
    known only where every other rank began its step after that start, and with two ranks the
    other one is then the last."""
    start, end = c.negotiate_start, c.negotiate_end
    if c.ticks or start is None or end is None or world_size < 2:
        return Negotiation()
    later = {
        r for r, t in (began or {}).items() if 0 <= r < world_size and t > start + BEGAN_SLACK_US
    }
    if len(later) >= world_size:
        return Negotiation()  # nobody could have started it: clocks or step matching are off
    if len(later) == world_size - 1:
        first = next(r for r in range(world_size) if r not in later)
        return Negotiation(first=first, last=1 - first if world_size == 2 else None)
    # a start right after the file opened may be the opening: the spread is then unknown
    clamped = opened is not None and start - opened <= OPENED_SLACK_US
    return Negotiation(together=not clamped and end - start <= wait_threshold_us)


def last_rank(
    c: Collective,
    world_size: int,
    wait_threshold_us: float,
    negotiated: Optional[Negotiation] = None,
) -> Optional[int]:
    """The rank that became ready last, when the timeline (and the ranks' step starts) tell."""
    if len(c.ticks) >= world_size:
        return max(c.ticks, key=lambda r: (c.ticks[r], r))
    if c.ticks:
        return None  # some ranks' ticks are missing: their requests came before the file
    if negotiated is None:
        negotiated = negotiation(c, world_size, wait_threshold_us)
    return negotiated.last


def rank_view(
    c: Collective,
    rank: int,
    world_size: int,
    wait_threshold_us: float = 3000.0,
    negotiated: Optional[Negotiation] = None,
) -> Optional[RankView]:
    """Where ``rank`` arrived, waited and transferred in this collective (None: no op phase);
    ``negotiated``: ``negotiation`` of ``c`` (once per collective), else read without the
    ranks' step starts."""
    if c.op_start is None or c.op_end is None:
        return None
    last = c.last_ready
    last = c.op_start if last is None else min(last, c.op_start)
    transfer_start = c.op_start
    if negotiated is None:
        negotiated = negotiation(c, world_size, wait_threshold_us)
    who_last = last_rank(c, world_size, wait_threshold_us, negotiated)
    if rank in c.ticks:
        arrival, how = c.ticks[rank], "tick"
    elif negotiated.first == rank and c.negotiate_start is not None:
        arrival, how = c.negotiate_start, "negotiate"  # the first request seen by any rank
    elif who_last == rank:
        arrival, how = last, "inferred"
    elif negotiated.together:
        arrival, how = last, "negotiate"  # ready within the threshold of the first: no wait
    else:
        arrival, how = last, "unknown"
    arrival = min(arrival, last)
    return RankView(arrival, last, c.op_end, transfer_start, who_last == rank, how)


def short_name(tensor: str) -> str:
    return tensor.rsplit("/", 1)[-1]


def collective_key(step_key: str, step: int, tensor: str) -> str:
    return f"{step_key}/{step}/{tensor}"


def records_for(
    c: Collective,
    view: RankView,
    step: int,
    key: str,
    to_local_ns: Any,
    group_prefix: str = "",
) -> List[record.Record]:
    """The collective span of one rank with its wait and transfer children (LOCAL clock)."""
    start = to_local_ns(view.arrival)
    end = max(start, to_local_ns(view.end))
    wait_ns = max(0, to_local_ns(view.last_ready) - start)
    attributes: Dict[str, Any] = {
        ATTR_OP: c.op,
        ATTR_TENSOR: c.tensor,
        ATTR_LAST: view.last_arrival,
        ATTR_WAIT: wait_ns if view.how != "unknown" else 0,
        ATTR_ARRIVAL: view.how,
        record.ATTR_COLLECTIVE_KEY: key,
    }
    for name, value in (
        (ATTR_DTYPE, c.dtype),
        (ATTR_SHAPE, c.shape),
        (ATTR_BYTES, c.nbytes),
        (ATTR_BACKEND, c.backend),
    ):
        if value is not None:
            attributes[name] = value
    if c.fused_group is not None:
        attributes[ATTR_FUSED] = f"{group_prefix}{c.fused_group}"
    parent = record.Record(
        f"horovod.{c.op} {short_name(c.tensor)}",
        start,
        end,
        record.COLLECTIVE,
        step=step,
        attributes=attributes,
    )
    out = [parent]
    if view.how != "unknown" and wait_ns > 0:
        out.append(
            record.Record(
                "wait",
                start,
                start + wait_ns,
                record.COLLECTIVE_WAIT,
                step=step,
                attributes={ATTR_WAIT: wait_ns, record.ATTR_COLLECTIVE_KEY: key},
                parent_id=parent.record_id,
            )
        )
    t_start = max(start, to_local_ns(view.transfer_start))
    out.append(
        record.Record(
            f"transfer {c.backend or ''}".strip(),
            t_start,
            max(t_start, end),
            record.COLLECTIVE_TRANSFER,
            step=step,
            attributes={record.ATTR_COLLECTIVE_KEY: key},
            parent_id=parent.record_id,
        )
    )
    return out
