"""Horovod collectives from rank 0's Horovod timeline: ``TF_OTEL_HOROVOD_SOURCE=timeline``
(``managed``) or a program's own ``HOROVOD_TIMELINE`` file (``user_file``); the default source
is ``stamps``. ``collective_source.choice`` picks one at hvd.init(); this hook stays idle under
any other.

The allreduce runs inside the TF graph, so Python wrappers would only time dispatch. Instead:

- before ``hvd.init()`` tf_otel sets ``HOROVOD_TIMELINE=DYNAMIC`` (a user's own file is read,
  never started, stopped or removed);
- rank 0 starts a timeline file for each detail step, at the end of the step before where the
  sampler decides by trace id alone (a rank already in the step's collectives then has its
  NEGOTIATE start written), switches files between detail steps without stopping, tails them on
  a daemon thread and turns each tensor's events into a ``collective`` record per rank with
  ``collective.wait`` / ``collective.transfer`` children (sources.horovod_timeline);
- every other rank tells rank 0 when it began each detail step (``hvd.b``): on a response-cache
  hit the timeline says when the first and last rank arrived, not which rank was which;
- rank 0 emits its own records and sends every other rank its share (``hvd.c``); each rank
  emits its own spans under its step span.

Usage::

    from tf_otel.instrument.horovod.timeline import hook
    hook.register()   # step hook, its message handlers, its exit hand-over

TF_OTEL_HOROVOD_EXACT=1 also sets HOROVOD_CACHE_CAPACITY=0 (per-rank ready ticks on every step,
at Horovod's negotiation cost). See docs/guides/HOROVOD.md.
"""

from __future__ import annotations

import glob
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from tf_otel import clock
from tf_otel.cluster import messages
from tf_otel.health import count, fail_open, log_once, logger
from tf_otel.instrument._patching import Error, HookOrder, StepCall, StepHook, add_step_hook
from tf_otel.instrument.horovod.collective_source import (
    MANAGED,
    OFF,
    TIMELINE_MODES,
    USER_FILE,
    choice,
    detail_wanted,
)
from tf_otel.runtime.lifecycle import current_pipeline
from tf_otel.runtime.steps import Pipeline
from tf_otel.sources import horovod_timeline as tl
from tf_otel.step_handle import StepHandle

_POLL_S = 0.2
_CLOSE_WAIT_S = 3.0  # a stopped file not closed by Horovod after this is read as it is
_USER_GRACE_NS = 2_000_000_000  # user timeline: a window is final this long after its step
_MAX_WINDOWS = 256
# per step window: bounds its list, every rank's share of it and the hvd.c message carrying it
# (a step that never ends would otherwise collect every later collective)
MAX_COLLECTIVES_PER_STEP = 20_000
_EXIT_WAIT_S = 3.0
# rank 0 holds a finished step this long for the ranks' step starts (``hvd.b``, sent as each
# rank begins the step, so normally long in); without them its cache hits read ``unknown``
_BEGAN_WAIT_S = 1.0
_PREFIX = "tf_otel-hvd-"


def _to_reference_ns_of_rank0() -> int:
    """rank 0: timeline us-since-epoch (system clock) -> reference ns offset."""
    return clock.current_model().to_reference(clock.now_ns()) - time.time_ns()


def _from_reference(ref_ns: int) -> int:
    """reference ns -> this rank's local clock (inverse of the clock model, one iteration)."""
    return clock.current_model().to_local(ref_ns)


class _Source:
    """One timeline file rank 0 reads."""

    def __init__(self, path: str, managed: bool) -> None:
        self.path = path
        self.managed = managed
        self.reader = tl.TimelineReader(path)
        self.parser = tl.TimelineParser()
        self.stopped_at: Optional[float] = None  # monotonic time of stop (managed)
        # when Horovod began writing it (rank 0's local = reference ns); None: a user's file,
        # written from hvd.init() on
        self.opened_ns: Optional[int] = None
        self.done = False
        # the file Horovod wrote just before this one, switched to without a gap: read first,
        # its collectives in progress continue here (``TimelineParser.continue_from``)
        self.after: Optional[_Source] = None


@dataclass(slots=True)
class _Window:
    """Rank 0: one sampled step's time window (local ns; ``end`` None while it runs), the
    timeline file being written during it (None: a user's file), the collectives matched to it
    (at most MAX_COLLECTIVES_PER_STEP)."""

    start: int
    end: Optional[int] = None
    source: Optional[_Source] = None
    items: List[tl.Collective] = field(default_factory=list)
    held_since: Optional[float] = None  # monotonic: ready but for some ranks' step starts


class TimelineHook(StepHook[None]):
    """Rank 0: timeline management and parsing; other ranks: receive and emit their records."""

    order = HookOrder.HOROVOD

    def __init__(self) -> None:
        self.running: Optional[_Source] = None  # managed file being written
        self._sources: List[_Source] = []
        self._windows: OrderedDict[Tuple[str, int], _Window] = OrderedDict()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._seq = 0
        self._pending: OrderedDict[Tuple[str, int], None] = OrderedDict()  # ranks > 0
        # rank 0: each detail step's start on the other ranks, {rank: reference ns} (hvd.b)
        self._began: OrderedDict[Tuple[str, int], Dict[int, int]] = OrderedDict()
        self._done = threading.Event()
        self._finished = False
        self.wait_threshold_us = 3000.0

    # -- step hook (training thread) ---------------------------------------------------------

    def on_step_start(self, handle: StepHandle, call: StepCall) -> None:
        if not handle.sampled:
            if self.running is not None:  # opened ahead for a step that did not come
                self._stop_managed()
            return
        if choice.mode == OFF or self._finished:
            return
        pipeline = current_pipeline()
        if pipeline is None or pipeline.topology.world_size < 2:
            return
        mode = choice.current()
        if mode not in TIMELINE_MODES:
            return  # not decided yet (Horovod not up), off, or the stamps' (stamps.hook)
        if mode == MANAGED and not choice.wanted(handle):
            if self.running is not None:  # opened ahead for a step that did not come
                self._stop_managed()
            return  # the same detail-step policy as the stamps (TF_OTEL_HOROVOD_EVERY)
        if pipeline.topology.rank != 0:
            self._expect(handle.key, handle.step)
            with fail_open("horovod.began"):
                self._send_began(pipeline, handle)
            return
        if mode == MANAGED and not self._start_managed():
            return
        if mode == USER_FILE and not self._sources:
            self._sources.append(_Source(os.environ["HOROVOD_TIMELINE"].strip(), managed=False))
        with self._lock:
            self._windows[(handle.key, handle.step)] = _Window(handle.start_ns, None, self.running)
            while len(self._windows) > _MAX_WINDOWS:
                self._windows.popitem(last=False)
                count("horovod_windows_dropped")
        self._ensure_thread()

    def on_step_end(self, handle: StepHandle, call: StepCall, error: Error, kept: None) -> None:
        if choice.mode not in TIMELINE_MODES:
            return
        if handle.sampled:
            with self._lock:
                window = self._windows.get((handle.key, handle.step))
                if window is not None:
                    window.end = handle.end_ns or clock.now_ns()
        ahead = False
        if choice.mode == MANAGED and not self._finished:
            with fail_open("horovod.open_ahead"):
                ahead = self._next_is_detail(handle)
        if ahead and self._start_managed(switch=True):
            return
        if self.running is not None:
            self._stop_managed()

    def _next_is_detail(self, handle: StepHandle) -> bool:
        """Rank 0: whether the next step is a detail step, so its file starts now, at the end
        of this one. Horovod writes nothing while no file is open, so a file opened at rank 0's
        own step start holds no NEGOTIATE start for a rank already waiting there: a rank 0 late
        to begin the step would read as the first to arrive (sources.horovod_timeline.
        negotiation)."""
        pipeline = current_pipeline()
        if pipeline is None or pipeline.topology.rank != 0 or pipeline.topology.world_size < 2:
            return False
        ahead = pipeline.sampled_ahead(handle.key, handle.step + 1)
        return ahead is not None and ahead[1] and detail_wanted(ahead[0], choice.every)

    def _send_began(self, pipeline: Pipeline, handle: StepHandle) -> None:
        """A rank > 0: when it began this detail step (reference ns), for rank 0's reading of
        the step's response-cache hits. Not before the clock sync settled, nor where its
        uncertainty is over half the slack rank 0 allows: no evidence rather than a wrong one."""
        settled = pipeline.exporter.clock_settled_now()
        model = clock.current_model()
        if not settled or model.uncertainty_ns > tl.BEGAN_SLACK_US * 500:
            count("horovod_began_unsent")
            logger.debug(
                "tf_otel: hvd.b %s/%d not sent (clock settled %s, uncertainty %d ns)",
                handle.key,
                handle.step,
                settled,
                model.uncertainty_ns,
            )
            return
        began = model.to_reference(handle.start_ns)
        message: messages.HorovodBegan = {
            "t": messages.HVD_BEGAN,
            "k": handle.key,
            "s": handle.step,
            "b": max(0, int(began)),
        }
        pipeline.send_to_reference(message)

    def _start_managed(self, switch: bool = False) -> bool:
        """Start a managed file; ``switch``: also while one runs, which Horovod's writer closes
        as it opens the new one (one hand-over: a stop and then a start leave a gap of two, in
        which a rank already in the next step's collectives has its request unwritten; on a
        loaded host that gap took several ms and lost whole negotiations)."""
        previous = self.running
        if previous is not None and not switch:
            return True
        if not choice.horovod_ready():
            return False
        self._seq += 1
        path = os.path.join(tempfile.gettempdir(), f"{_PREFIX}{os.getpid()}-{self._seq}.json")
        try:
            choice.basics.start_timeline(path)
        except ValueError as exc:
            choice.mode = OFF
            log_once("hvd_start", "tf_otel: cannot start the Horovod timeline (%s)", exc)
            return False
        source = _Source(path, managed=True)
        if previous is None:
            source.opened_ns = clock.now_ns()  # after the writer took it (start_timeline waits)
        else:
            previous.stopped_at = time.monotonic()  # closed by the writer as it took this one
            source.after, source.opened_ns = previous, previous.opened_ns
        with self._lock:
            self._sources.append(source)
        self.running = source
        return True

    def _stop_managed(self) -> None:
        source, self.running = self.running, None
        if source is None:
            return
        with fail_open("horovod.stop_timeline"):
            if choice.horovod_ready():
                choice.basics.stop_timeline()
        source.stopped_at = time.monotonic()

    # -- rank 0: reader thread -----------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tf_otel-hvd", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(_POLL_S):
            with fail_open("horovod.timeline"):
                self.process(final=False)

    def process(self, final: bool) -> None:
        """Read new timeline events, attach collectives to steps, emit finished steps."""
        with self._lock:
            sources = list(self._sources)
        shift = _to_reference_ns_of_rank0()
        open_paths = _open_paths() if any(s.managed and s.stopped_at for s in sources) else None
        for source in sources:
            if source.done:
                continue
            if source.after is not None:
                if not source.after.done:
                    continue  # the file before it is read to its end first
                source.parser.continue_from(source.after.parser)
                source.after = None
            closed = final or (
                source.stopped_at is not None
                and (
                    (open_paths is not None and source.path not in open_paths)
                    or time.monotonic() - source.stopped_at > _CLOSE_WAIT_S
                )
            )
            for event in source.reader.poll(final=closed):
                source.parser.feed(event)
            self._attach(source.parser.take(), shift)
            if closed and source.managed:
                source.done = True
        self._emit_ready(final, shift)
        with self._lock:
            for source in [s for s in self._sources if s.done]:
                self._sources.remove(source)
                _remove(source.path)

    def _attach(self, collectives: List[tl.Collective], shift: int) -> None:
        if not collectives:
            return
        with self._lock:
            windows = list(self._windows.values())
        for c in collectives:
            window = _window_of(c, windows, shift)
            if window is None:
                count("horovod_collectives_unmatched")
            elif len(window.items) >= MAX_COLLECTIVES_PER_STEP:
                count("horovod_collectives_dropped")
                log_once(
                    "horovod_step_full",
                    "tf_otel: a step has over %d Horovod collectives; the rest are dropped "
                    "(counted)",
                    MAX_COLLECTIVES_PER_STEP,
                )
            else:
                window.items.append(c)

    def _emit_ready(self, final: bool, shift: int) -> None:
        now = clock.now_ns()
        pipeline = current_pipeline()
        world = pipeline.topology.world_size if pipeline is not None else 1
        ready: List[Tuple[Tuple[str, int], _Window, Dict[int, int]]] = []
        with self._lock:
            for key, window in list(self._windows.items()):
                if window.end is None and not final:
                    continue
                source = window.source
                if final or (source is not None and source.done):
                    pass
                elif source is None and now - (window.end or now) > _USER_GRACE_NS:
                    pass
                else:
                    continue
                if not final and self._await_began(key, window, world):
                    continue
                ready.append((key, self._windows.pop(key), self._began.pop(key, {})))
        for (step_key, step), window, began in ready:
            with fail_open("horovod.emit"):
                self._emit(step_key, step, window, began, shift)

    def _await_began(self, key: Tuple[str, int], window: _Window, world: int) -> bool:
        """Hold a finished window for the other ranks' step starts, at most _BEGAN_WAIT_S."""
        if len(self._began.get(key, ())) >= world - 1:
            return False
        if window.held_since is None:
            window.held_since = time.monotonic()
        if time.monotonic() - window.held_since < _BEGAN_WAIT_S:
            return True
        count("horovod_began_missing")
        logger.debug("tf_otel: hvd.b %s/%d: held %.1f s, read without", *key, _BEGAN_WAIT_S)
        return False

    def on_began(self, rank: int, message: Dict[str, Any]) -> None:
        """Rank 0 (coordinator thread): a rank began a detail step (a ``HorovodBegan``)."""
        with self._lock:
            self._began.setdefault((message["k"], message["s"]), {})[rank] = message["b"]
            while len(self._began) > _MAX_WINDOWS:
                self._began.popitem(last=False)

    def _emit(
        self, key: str, step: int, window: _Window, began_ns: Dict[int, int], shift: int
    ) -> None:
        pipeline = current_pipeline()
        if pipeline is None:
            return
        world = pipeline.topology.world_size
        items = window.items
        tl.assign_fused_groups(items)
        prefix = f"{key}/{step}/"

        def to_local(us: float) -> int:
            return int(us * 1000) + shift  # rank 0: reference == local

        def to_us(ns: int) -> float:
            return (ns - shift) / 1000.0

        # when each rank began the step, on the timeline's clock: who began after a cache hit's
        # negotiation started did not start it (rank 0's own: its window's start)
        began = {r: to_us(ns) for r, ns in began_ns.items() if 0 < r < world}
        began[0] = to_us(window.start)
        source = window.source
        opened = None
        if source is not None and source.opened_ns is not None:
            opened = to_us(source.opened_ns)
        records = []
        per_rank: Dict[int, List[messages.HorovodCollective]] = {r: [] for r in range(1, world)}
        for c in items:
            ckey = tl.collective_key(key, step, c.tensor)
            seen = tl.negotiation(c, world, self.wait_threshold_us, began, opened)
            if not c.ticks and logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "tf_otel: hvd cache hit %s/%d %s: negotiate %s..%s us, began %s, opened %s, "
                    "read %s",
                    key,
                    step,
                    c.tensor,
                    c.negotiate_start,
                    c.negotiate_end,
                    began,
                    opened,
                    seen,
                )
            for rank in range(world):
                view = tl.rank_view(c, rank, world, self.wait_threshold_us, seen)
                if view is None:
                    continue
                if rank == 0:
                    records.extend(tl.records_for(c, view, step, ckey, to_local, prefix))
                else:
                    per_rank[rank].append(_encode(c, view))
        if records:
            pipeline.add_records(key, step, records)
            count("horovod_collectives", len(items))
        for rank, encoded in per_rank.items():
            message: messages.HorovodRecords = {
                "t": messages.HVD_RECORDS,
                "k": key,
                "s": step,
                "sh": shift,
                "c": encoded,
            }
            if not pipeline.send_to_rank(rank, message):
                count("horovod_send_failed")

    # -- ranks > 0 ---------------------------------------------------------------------------

    def _expect(self, key: str, step: int) -> None:
        with self._lock:
            self._pending[(key, step)] = None
            while len(self._pending) > _MAX_WINDOWS:
                self._pending.popitem(last=False)

    def on_done(self, message: Dict[str, Any]) -> None:
        """A rank > 0: rank 0 has sent every step's records (its exit)."""
        self._done.set()

    def on_message(self, message: Dict[str, Any]) -> None:
        """Coordinator thread of a rank > 0: records for one of its steps, from rank 0 (an
        ``HorovodRecords``, checked by ``messages.decode``)."""
        key, step, shift = message["k"], message["s"], message["sh"]
        with self._lock:
            self._pending.pop((key, step), None)

        def to_local(us: float) -> int:
            return _from_reference(int(us * 1000) + shift)

        records = []
        for item in message["c"]:
            c, view = _decode(item)
            ckey = tl.collective_key(key, step, c.tensor)
            records.extend(tl.records_for(c, view, step, ckey, to_local, f"{key}/{step}/"))
        pipeline = current_pipeline()
        if records and pipeline is not None:
            pipeline.add_records(key, step, records)

    # -- exit ----------------------------------------------------------------------------------

    def finish(self) -> None:
        """At exit / SIGTERM: rank 0 flushes and tells the ranks; ranks wait (bounded)."""
        if self._finished or choice.mode not in TIMELINE_MODES:
            return
        self._finished = True
        pipeline = current_pipeline()
        if pipeline is None:
            return
        if pipeline.topology.rank == 0:
            self._stop.set()
            if self.running is not None:
                self._stop_managed()
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and self._unclosed():
                time.sleep(0.02)
            with fail_open("horovod.final"):
                self.process(final=True)
            pipeline.broadcast({"t": messages.HVD_DONE})
        else:
            deadline = time.monotonic() + _EXIT_WAIT_S
            while self._pending and time.monotonic() < deadline and not self._done.is_set():
                time.sleep(0.02)

    def _unclosed(self) -> bool:
        with self._lock:
            paths = {s.path for s in self._sources if s.managed}
        return bool(paths & (_open_paths() or set()))

    # -- registration ------------------------------------------------------------------------

    def _handle_messages(self, pipeline: Pipeline) -> None:
        pipeline.handlers.on_rank(messages.HVD_RECORDS, self.on_message)
        pipeline.handlers.on_rank(messages.HVD_DONE, self.on_done)
        pipeline.handlers.on_reference(messages.HVD_BEGAN, self.on_began)

    def register(self) -> None:
        """The step hook, its message handlers and its exit hand-over (once per process)."""
        from tf_otel.runtime.lifecycle import before_shutdown, with_pipeline

        add_step_hook(self)
        with_pipeline(self._handle_messages)
        before_shutdown(self.finish)  # exit and SIGTERM: hand over the timeline's last records
        with fail_open("horovod.stale"):
            _remove_stale()


def _encode(c: tl.Collective, v: tl.RankView) -> messages.HorovodCollective:
    return {
        "n": c.tensor,
        "o": c.op,
        "d": c.dtype,
        "p": c.shape,
        "b": c.backend,
        "f": c.fused_group,
        "v": [v.arrival, v.last_ready, v.end, v.transfer_start, v.last_arrival, v.how],
    }


def _decode(item: messages.HorovodCollective) -> Tuple[tl.Collective, tl.RankView]:
    c = tl.Collective(
        tensor=item["n"],
        op=item["o"],
        dtype=item.get("d"),
        shape=item.get("p"),
        backend=item.get("b"),
        fused_group=item.get("f"),
    )
    a, last, end, ts, flag, how = item["v"]
    return c, tl.RankView(float(a), float(last), float(end), float(ts), bool(flag), str(how))


def _open_paths() -> Optional[set]:
    """Files this process has open (Linux /proc); None where that cannot be read."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    paths = set()
    for fd in fds:
        try:
            paths.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return paths


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _remove_stale() -> None:
    """Timeline files of tf_otel processes that died without cleaning up (killed jobs)."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), _PREFIX + "*.json")):
        try:
            pid = int(os.path.basename(path)[len(_PREFIX) :].split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            _remove(path)
        except (ValueError, OSError):
            pass


hook = TimelineHook()


_MATCH_SLACK_NS = 1_000_000


def _window_of(c: tl.Collective, windows: List[_Window], shift: int) -> Optional[_Window]:
    """The step window a collective belongs to: the one its op overlaps most. Horovod writes the
    op's end after TF has its result, so the end can fall just past its step (into the next)."""
    end_ns = int((c.op_end or 0) * 1000) + shift
    start_ns = int((c.op_start if c.op_start is not None else c.op_end or 0) * 1000) + shift
    best, best_overlap = None, None
    for window in windows:
        hi = window.end if window.end is not None else end_ns
        overlap = min(end_ns, hi) - max(start_ns, window.start)
        if overlap < -_MATCH_SLACK_NS:
            continue
        if best_overlap is None or overlap > best_overlap:
            best, best_overlap = window, overlap
    return best
