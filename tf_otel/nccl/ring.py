"""Read the NCCL profiler plugin's shared-memory ring into Records.

Usage::

    from tf_otel.nccl.ring import RingReader, ring_path
    reader = RingReader.open(ring_path())          # /dev/shm/tf_otel_nccl_<this pid>
    ring_path(directory=settings.nccl_ring_dir)    # where TF_OTEL_NCCL_RING_DIR says
    events, lost = reader.read_new()               # raw CollEvents since the last call
    records = reader.poll(rank=0, step=12)         # settled, merged -> kernel Records
    reader.close(unlink=True)

The plugin (tf_otel/nccl/plugin/tf_otel_nccl_profiler.c) writes one fixed-size record per
Coll event (layout: plugin/tf_otel_nccl_ring.h), possibly several times per collective as its
child events finish (NCCL 2.28.9 on an H100: twice, at the Coll stop and at the last child's);
``poll`` keeps the latest per (comm_hash, func, seq, rank) and emits it once it has been quiet
for ``settle_ns``. NCCL numbers collectives per communicator *and collective type*
(``comm->seqNumber[func]``): (comm_hash, collective, seq) is the same on every rank for one
collective, the cross-rank join key (``nccl.comm_hash`` + ``nccl.collective`` + ``nccl.seq``).

Times: ``start_ns`` is when NCCL starts the Coll event, just after it launched the kernel
(``ncclLaunchKernelAfter``), so on an idle stream the kernel may begin a few microseconds
before it and on a busy one long after; ``end_ns`` (``nccl.timing=execution``) is the last
child event's stop, microseconds after the kernel's end. ``nccl.gpu_duration_ns`` is the
kernel's own run time from the GPU timers NCCL passes with KernelCh events (v4+).
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Tuple

from tf_otel.nccl import kernels as k
from tf_otel.record import KERNEL, Record

log = logging.getLogger(__name__)

MAGIC = b"TFOTNCL1"
VERSION = 1
HEADER = struct.Struct("<8sIIIIQQiIQ72x")  # 128 bytes, see tf_otel_nccl_ring.h
RECORD = struct.Struct("<QQQQQQQQQQiiiHBBBB6x20s20s20s12s12s4x")  # 192 bytes
FLAG_CHILD_TIMING = 1
FLAG_FLUSHED = 2
DEFAULT_DIR = "/dev/shm"
_MAX_PENDING = 65536

assert HEADER.size == 128 and RECORD.size == 192


def ring_path(pid: int | None = None, directory: str | None = None) -> str:
    """Where the plugin in process ``pid`` (default: this one) writes its ring, in
    ``directory`` (TF_OTEL_NCCL_RING_DIR; default /dev/shm)."""
    d = directory or DEFAULT_DIR
    return os.path.join(d, f"tf_otel_nccl_{pid if pid is not None else os.getpid()}")


@dataclass
class CollEvent:
    """One NCCL collective as the plugin saw it on one rank (times: CLOCK_REALTIME ns)."""

    index: int
    comm_hash: int
    seq: int
    start_ns: int
    enqueued_ns: int
    end_ns: int
    count: int
    bytes: int
    gpu_start: int
    gpu_end: int
    rank: int
    nranks: int
    root: int
    nchildren: int
    nchannels: int
    nwarps: int
    api_version: int
    flags: int
    func: str
    dtype: str
    algo: str
    proto: str
    op: str

    @property
    def key(self) -> Tuple[int, str, int, int]:
        """One collective on one rank: NCCL numbers collectives per communicator *and type*
        (``comm->seqNumber[func]``), so the first AllReduce and the first AllGather both have
        seq 0."""
        return (self.comm_hash, self.func, self.seq, self.rank)


def _s(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("ascii", "replace")


class RingError(ValueError):
    """The file is not a tf_otel NCCL ring this version can read."""


class RingReader:
    """Reads one ring file; never writes it. Not thread-safe (one reader per ring)."""

    def __init__(self, path: str, mm: mmap.mmap, capacity: int) -> None:
        self.path = path
        self._mm = mm
        self.capacity = capacity
        self._next = 0
        self.lost = 0  # records overwritten before they were read
        self._pending: Dict[Tuple[int, str, int, int], CollEvent] = {}

    @classmethod
    def open(cls, path: str) -> RingReader:
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < HEADER.size:
                    raise RingError(f"{path}: {size} bytes, too small for a tf_otel NCCL ring")
                mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        except OSError as e:
            raise RingError(f"{path}: cannot open the NCCL ring: {e}") from e
        magic, ver, hsize, rsize, cap, *_ = HEADER.unpack_from(mm, 0)
        problem = None
        if magic != MAGIC:
            problem = f"bad magic {magic!r} (not a tf_otel NCCL ring, or not initialised yet)"
        elif ver != VERSION or hsize != HEADER.size or rsize != RECORD.size:
            problem = f"layout v{ver} header={hsize} record={rsize}, expected v{VERSION} 128/192"
        elif cap <= 0 or size < HEADER.size + cap * RECORD.size:
            problem = f"capacity {cap} does not fit the file size {size}"
        if problem:
            mm.close()
            raise RingError(f"{path}: {problem}")
        return cls(path, mm, cap)

    def header(self) -> Dict[str, int]:
        _, ver, _, _, cap, widx, dropped, pid, api, created = HEADER.unpack_from(self._mm, 0)
        return {
            "version": ver,
            "capacity": cap,
            "write_index": widx,
            "dropped": dropped,
            "pid": pid,
            "api_version": api,
            "created_ns": created,
        }

    def _read_one(self, i: int) -> CollEvent | None:
        off = HEADER.size + (i % self.capacity) * RECORD.size
        for _ in range(3):  # a writer may be mid-record: retry, then give up on it
            raw = self._mm[off : off + RECORD.size]
            v = RECORD.unpack(raw)
            if v[0] != i + 1:
                return None  # not yet committed, or already overwritten
            if struct.unpack_from("<Q", self._mm, off)[0] == i + 1:
                return CollEvent(i, *v[1:18], *(_s(b) for b in v[18:23]))
        return None

    def read_new(self) -> Tuple[List[CollEvent], int]:
        """Complete records written since the last call, and how many were lost meanwhile."""
        widx = struct.unpack_from("<Q", self._mm, 24)[0]
        out: List[CollEvent] = []
        lost = 0
        first = max(self._next, widx - self.capacity)
        lost += first - self._next
        i = first
        while i < widx:
            ev = self._read_one(i)
            if ev is None:
                # claimed but not committed yet: stop here and retry it next time, unless
                # it is so old that the writer has since lapped it
                if widx - i >= self.capacity:
                    lost += 1
                    i += 1
                    continue
                break
            out.append(ev)
            i += 1
        self._next = i
        self.lost += lost
        return out, lost

    def poll(
        self,
        rank: int | None = None,
        step: int | None = None,
        settle_ns: int = 50_000_000,
        now_ns: int | None = None,
        flush: bool = False,
    ) -> List[Record]:
        """Records for collectives quiet for ``settle_ns`` (all of them with ``flush``)."""
        events, _ = self.read_new()
        for ev in events:
            old = self._pending.get(ev.key)
            if old is None or ev.index > old.index:
                self._pending[ev.key] = ev
        now = time.time_ns() if now_ns is None else now_ns
        ready = [e for e in self._pending.values() if flush or now - e.end_ns >= settle_ns]
        if len(self._pending) - len(ready) > _MAX_PENDING:  # bounded: emit the oldest anyway
            done = {e.key for e in ready}
            rest = sorted(
                (e for e in self._pending.values() if e.key not in done), key=lambda e: e.end_ns
            )
            ready += rest[: len(rest) - _MAX_PENDING]
        for e in ready:
            del self._pending[e.key]
        ready.sort(key=lambda e: e.start_ns)
        return [to_record(e, rank=rank, step=step) for e in ready]

    def close(self, unlink: bool = False) -> None:
        try:
            self._mm.close()
        finally:
            if unlink:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass


def to_record(ev: CollEvent, rank: int | None = None, step: int | None = None) -> Record:
    """One ``kernel`` Record for a collective; attributes follow the trace contract."""
    coll = k.normalize_collective(ev.func) or "unknown"
    dtype = k.normalize_dtype(ev.dtype)
    nbytes = ev.bytes
    if not nbytes and ev.count:
        nbytes = ev.count * (k.dtype_size(dtype) or 0)
    attrs = {
        "nccl.collective": coll,
        "nccl.dtype": dtype,
        "nccl.algorithm": k.normalize_algorithm(ev.algo),
        "nccl.protocol": k.normalize_protocol(ev.proto),
        "nccl.op": ev.op or None,
        "nccl.comm_hash": f"{ev.comm_hash:016x}",
        "nccl.seq": ev.seq,
        "nccl.count": ev.count,
        "nccl.bytes": nbytes,
        "nccl.rank": ev.rank,
        "nccl.nranks": ev.nranks or None,
        "nccl.channels": ev.nchannels,
        # "execution": ended by proxy/kernel events; "enqueue": only the host enqueue is known
        "nccl.timing": "execution" if ev.flags & FLAG_CHILD_TIMING else "enqueue",
        "nccl.profiler_version": ev.api_version,
    }
    if ev.gpu_start and ev.gpu_end > ev.gpu_start:  # GPU globaltimer: a duration, no epoch
        attrs["nccl.gpu_duration_ns"] = ev.gpu_end - ev.gpu_start
    if rank is not None:
        attrs["tf_otel.rank"] = rank
    end = max(ev.end_ns, ev.enqueued_ns, ev.start_ns)
    return Record(
        name=f"nccl.{coll}",
        start_ns=ev.start_ns,
        end_ns=end,
        category=KERNEL,
        step=step,
        attributes={a: v for a, v in attrs.items() if v is not None},
    )


# what the ring says of a collective is what NCCL ran; a kernel name says what the kernel was
# specialised for (NCCL 2.28: a Max AllReduce of int8 runs in ncclDevKernel_AllReduce_Sum_u8_..)
_RAN = ("nccl.dtype", "nccl.algorithm", "nccl.protocol", "nccl.count", "nccl.bytes")


def join_kernels(
    kernel_records: Iterable[Record], ring_records: Iterable[Record], slack_ns: int = 1_000_000
) -> int:
    """Copy ``nccl.comm_hash`` / ``nccl.seq`` from ring Records onto the CUPTI kernel Records
    of the same rank that they launched, so kernel spans join across ranks, and replace the
    kernel's dtype / algorithm / protocol (its specialisation) by what NCCL ran, with count
    and bytes; ``nccl.op`` is dropped unless the ring has it (profiler v1 only).

    Matching is in launch order per collective type: each kernel takes the next ring record of
    its type unless that record starts more than ``slack_ns`` after the kernel (the kernel is
    not one the ring knows); NCCL starts its Coll event just after the launch, so a kernel on
    an idle stream may start first (17 us seen on an H100). A record with execution timing that
    ended more than ``slack_ns`` before the kernel started is skipped: its kernel is not among
    ``kernel_records`` (e.g. before the CUPTI capture began). Returns how many kernels got a
    key."""
    by_coll: Dict[str, List[Record]] = {}
    for r in sorted(ring_records, key=lambda r: r.start_ns):
        by_coll.setdefault(str(r.attributes.get("nccl.collective")), []).append(r)
    joined = 0
    pos: Dict[str, int] = {}
    for kr in sorted(kernel_records, key=lambda r: r.start_ns):
        coll = kr.attributes.get("nccl.collective")
        if coll is None or "nccl.seq" in kr.attributes:
            continue
        cands = by_coll.get(str(coll), [])
        i = pos.get(str(coll), 0)
        while i < len(cands):
            c = cands[i]
            if c.start_ns - slack_ns > kr.start_ns:
                break  # launched after this kernel started: this kernel is none we know
            if c.attributes.get("nccl.timing") == "execution" and c.end_ns + slack_ns < kr.start_ns:
                i += 1  # finished before this kernel began: its own kernel was not captured
                continue
            kr.attributes["nccl.comm_hash"] = c.attributes["nccl.comm_hash"]
            kr.attributes["nccl.seq"] = c.attributes["nccl.seq"]
            for a in _RAN:
                if c.attributes.get(a) is not None:
                    kr.attributes[a] = c.attributes[a]
            if c.attributes.get("nccl.op"):
                kr.attributes["nccl.op"] = c.attributes["nccl.op"]
            else:
                kr.attributes.pop("nccl.op", None)
            i += 1
            joined += 1
            break
        pos[str(coll)] = i
    return joined


def cleanup_stale(directory: str = DEFAULT_DIR) -> int:
    """Remove ring files of processes that no longer exist; returns how many."""
    removed = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if not name.startswith("tf_otel_nccl_"):
            continue
        try:
            pid = int(name[len("tf_otel_nccl_") :])
            os.kill(pid, 0)
        except ValueError:
            continue
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(directory, name))
                removed += 1
            except OSError:
                pass
        except PermissionError:
            continue  # alive, someone else's
    return removed
