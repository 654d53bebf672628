"""Horovod collectives on every rank's step trace: by default timed by every rank itself
(instrument.horovod_stamps); with TF_OTEL_HOROVOD_SOURCE=timeline or a user's HOROVOD_TIMELINE
file, from rank 0's Horovod timeline (below).

The allreduce runs inside the TF graph, so Python wrappers would only time dispatch. Instead:

- before ``hvd.init()`` tf_otel sets ``HOROVOD_TIMELINE=DYNAMIC`` (unless the user set
  HOROVOD_TIMELINE; a user's file is then read, never started, stopped or removed);
- rank 0 starts a timeline file at the start of each sampled step and stops it at its end
  (untraced steps: one attribute check), tails it on a daemon thread, and turns each tensor's
  NEGOTIATE / per-rank ready ticks / op phases into, for every rank, a ``collective`` record with
  ``collective.wait`` and ``collective.transfer`` children (capture.horovod_timeline);
- rank 0 emits its own records with ``Pipeline.add_records`` and sends every other rank its share
  over the coordinator (``hvd.c`` messages); each rank emits its own spans under its step span.

Also: Keras 3 optimizers given to ``hvd.DistributedOptimizer`` (gradients silently not
averaged) are reported once, naming the fix. See docs/HOROVOD.md.

Env: TF_OTEL_HOROVOD=0 turns this off; TF_OTEL_HOROVOD_EXACT=1 also sets
HOROVOD_CACHE_CAPACITY=0 (per-rank ready ticks on every step, at Horovod's negotiation cost).
"""

from __future__ import annotations

import glob
import logging
import os
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from tf_otel import clock
from tf_otel.health import count, fail_open, log_once
from tf_otel.instrument._patching import (
    StepHook,
    add_step_hook,
    is_active,
    when_imported,
    wrap,
)
from tf_otel.instrument.horovod_stamps import OPS, collector, parts_wanted
from tf_otel.pipeline import messages
from tf_otel.sources import horovod_timeline as tl

_POLL_S = 0.2
_CLOSE_WAIT_S = 3.0  # a stopped file not closed by Horovod after this is read as it is
_USER_GRACE_NS = 2_000_000_000  # user timeline: a window is final this long after its step
_MAX_WINDOWS = 256
# per step window: bounds its list, every rank's share of it and the hvd.c message carrying it
# (a step that never ends would otherwise collect every later collective)
MAX_COLLECTIVES_PER_STEP = 20_000
_EXIT_WAIT_S = 3.0
_PREFIX = "tf_otel-hvd-"

MANAGED, USER_FILE, OFF, STAMPS = "managed", "user_file", "off", "stamps"


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
        self.done = False


@dataclass(slots=True)
class _Window:
    """Rank 0: one sampled step's time window (local ns; ``end`` None while it runs), the
    timeline file being written during it (None: a user's file), the collectives matched to it
    (at most MAX_COLLECTIVES_PER_STEP)."""

    start: int
    end: Optional[int] = None
    source: Optional[_Source] = None
    items: List[tl.Collective] = field(default_factory=list)


class HorovodCollectives(StepHook):
    """Rank 0: timeline management and parsing; other ranks: receive and emit their records."""

    def __init__(self) -> None:
        self.mode: Optional[str] = None
        self.basics: Any = None  # horovod.common.basics.HorovodBasics of hvd.init
        self.running: Optional[_Source] = None  # managed file being written
        self._sources: List[_Source] = []
        self._windows: OrderedDict[Tuple[str, int], _Window] = OrderedDict()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._seq = 0
        self._pending: OrderedDict[Tuple[str, int], None] = OrderedDict()  # ranks > 0
        self._done = threading.Event()
        self._finished = False
        self.wait_threshold_us = 3000.0

    # -- set-up ----------------------------------------------------------------------------

    def before_init(self) -> None:
        """Called just before hvd.init(): choose the mode and set Horovod's env."""
        if self.mode is not None:
            return
        if not _settings().horovod:
            self.mode = OFF
            return
        current = os.environ.get("HOROVOD_TIMELINE", "").strip()
        if not current and _settings().horovod_source != "timeline":
            self.mode = STAMPS  # no HOROVOD_TIMELINE: its writer thread spins from hvd.init
            return
        if not current:
            os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"
            self.mode = MANAGED
        elif current.upper() == "DYNAMIC":
            self.mode = OFF
            log_once(
                "hvd_user_dynamic",
                "tf_otel: HOROVOD_TIMELINE=DYNAMIC is set by you: tf_otel leaves the timeline "
                "to you and records no Horovod collective spans",
                level=logging.INFO,
            )
        else:
            self.mode = USER_FILE
        if _settings().horovod_exact:
            os.environ.setdefault("HOROVOD_CACHE_CAPACITY", "0")

    def _resolve_late(self) -> None:
        """tf_otel instrumented after hvd.init(): only a user's timeline file can be read."""
        current = os.environ.get("HOROVOD_TIMELINE", "").strip()
        if current and current.upper() != "DYNAMIC" and _settings().horovod:
            self.mode = USER_FILE
        elif _settings().horovod and _settings().horovod_source != "timeline":
            self.mode = STAMPS  # timing our own ops needs nothing set before hvd.init
        else:
            self.mode = OFF
            log_once(
                "hvd_late",
                "tf_otel: Horovod was initialised before tf_otel instrumented it; no collective "
                "spans. Instrument before hvd.init() (or run with TF_OTEL_ENABLED=1)",
            )

    # -- step hook (training thread) ---------------------------------------------------------

    def on_step_start(self, handle: Any, call: Any) -> None:
        if not handle.sampled:
            if self.running is not None:
                self._stop_managed()
            return
        if self.mode == OFF or self._finished:
            return
        pipeline = _pipeline()
        if pipeline is None or pipeline.topology.world_size < 2:
            return
        if self.mode is None and self._horovod_ready():
            self._resolve_late()
        if self.mode == STAMPS:
            if collector.backend is None:
                collector.backend = self._backend()
            collector.begin(handle)
            return
        if self.mode == MANAGED and not collector.wanted(handle):
            return  # the same detail-step policy as the stamps (TF_OTEL_HOROVOD_EVERY)
        if pipeline.topology.rank != 0:
            self._expect(handle.key, handle.step)
            return
        if self.mode is None:
            if not self._horovod_ready():
                return
            self._resolve_late()
            if self.mode == OFF:
                return
        if self.mode == MANAGED and not self._start_managed():
            return
        if self.mode == USER_FILE and not self._sources:
            self._sources.append(_Source(os.environ["HOROVOD_TIMELINE"].strip(), managed=False))
        with self._lock:
            self._windows[(handle.key, handle.step)] = _Window(handle.start_ns, None, self.running)
            while len(self._windows) > _MAX_WINDOWS:
                self._windows.popitem(last=False)
                count("horovod_windows_dropped")
        self._ensure_thread()

    def on_step_end(self, handle: Any, call: Any, error: Optional[BaseException]) -> None:
        if not handle.sampled or self.mode in (None, OFF):
            return
        if self.mode == STAMPS:
            collector.end(handle)
            return
        with self._lock:
            window = self._windows.get((handle.key, handle.step))
            if window is not None:
                window.end = handle.end_ns or clock.now_ns()
        if self.running is not None:
            self._stop_managed()

    def stamping(self) -> bool:
        """Graph construction: time Horovod ops (default source, more than one rank)?"""
        if self.mode is None and self._horovod_ready():
            self._resolve_late()
        if self.mode != STAMPS or self._finished or not is_active() or collector.every <= 0:
            return False  # TF_OTEL_HOROVOD_EVERY=0 (default): no timing ops in the graph
        try:
            return int(self.basics.size()) > 1
        except Exception:  # noqa: BLE001
            return False

    def _backend(self) -> Optional[str]:
        try:
            return "gloo" if self.basics.gloo_enabled() else "mpi"
        except Exception:  # noqa: BLE001
            return None

    def _horovod_ready(self) -> bool:
        basics = self.basics
        if basics is None:
            module = sys.modules.get("horovod.tensorflow.mpi_ops")
            basics = getattr(module, "_basics", None)
            self.basics = basics
        try:
            return basics is not None and bool(basics.is_initialized())
        except Exception:  # noqa: BLE001
            return False

    def _start_managed(self) -> bool:
        if self.running is not None:
            return True
        if not self._horovod_ready():
            return False
        self._seq += 1
        path = os.path.join(tempfile.gettempdir(), f"{_PREFIX}{os.getpid()}-{self._seq}.json")
        try:
            self.basics.start_timeline(path)
        except ValueError as exc:
            self.mode = OFF
            log_once("hvd_start", "tf_otel: cannot start the Horovod timeline (%s)", exc)
            return False
        source = _Source(path, managed=True)
        with self._lock:
            self._sources.append(source)
        self.running = source
        return True

    def _stop_managed(self) -> None:
        source, self.running = self.running, None
        if source is None:
            return
        with fail_open("horovod.stop_timeline"):
            if self._horovod_ready():
                self.basics.stop_timeline()
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
        ready = []
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
                ready.append((key, self._windows.pop(key)))
        for (key, step), window in ready:  # type: ignore[assignment]  # key: (key, step) above
            with fail_open("horovod.emit"):
                self._emit(key, step, window.items, shift)  # type: ignore[arg-type]

    def _emit(self, key: str, step: int, items: List[tl.Collective], shift: int) -> None:
        pipeline = _pipeline()
        if pipeline is None:
            return
        world = pipeline.topology.world_size
        tl.assign_fused_groups(items)
        prefix = f"{key}/{step}/"

        def to_local(us: float) -> int:
            return int(us * 1000) + shift  # rank 0: reference == local

        records = []
        per_rank: Dict[int, List[messages.HorovodCollective]] = {r: [] for r in range(1, world)}
        for c in items:
            ckey = tl.collective_key(key, step, c.tensor)
            for rank in range(world):
                view = tl.rank_view(c, rank, world, self.wait_threshold_us)
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
        pipeline = _pipeline()
        if records and pipeline is not None:
            pipeline.add_records(key, step, records)

    # -- exit ----------------------------------------------------------------------------------

    def finish(self) -> None:
        """At exit / SIGTERM: rank 0 flushes and tells the ranks; ranks wait (bounded)."""
        if self._finished or self.mode in (None, OFF):
            return
        self._finished = True
        pipeline = _pipeline()
        if pipeline is None:
            return
        if self.mode == STAMPS:
            collector.finish(pipeline.topology.rank == 0, _EXIT_WAIT_S)
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


def _settings() -> Any:
    from tf_otel.config import Settings

    return Settings.from_env()


def _pipeline() -> Any:
    from tf_otel.pipeline.lifecycle import current_pipeline

    return current_pipeline()  # created by the first step; None before


# -- Keras 3 + DistributedOptimizer ---------------------------------------------------------


def _is_keras3_optimizer(optimizer: Any) -> bool:
    module = type(optimizer).__module__ or ""
    if not module.startswith("keras"):
        return False
    keras = sys.modules.get("keras")
    return str(getattr(keras, "__version__", "3")).startswith("3")


def _check_optimizer(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    optimizer = args[0] if args else kwargs.get("optimizer")
    with fail_open("horovod.keras3_check"):
        if _is_keras3_optimizer(optimizer):
            log_once(
                "hvd_keras3",
                "tf_otel: hvd.DistributedOptimizer got a Keras 3 optimizer (%s): Horovod does "
                "not average its gradients, so ranks silently diverge. Use tf_keras "
                "(TF_USE_LEGACY_KERAS=1, pip install tf_keras) or hvd.DistributedGradientTape "
                "in a custom loop",
                type(optimizer).__name__,
            )
    return wrapped(*args, **kwargs)


# -- registration ---------------------------------------------------------------------------

hook = HorovodCollectives()
_registered = False


def _init_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    with fail_open("horovod.before_init"):
        hook.before_init()
        hook.basics = instance
    return wrapped(*args, **kwargs)


def _patch_basics(module: Any) -> None:
    wrap(module.HorovodBasics, "init", _init_wrapper)


def _patch_mpi_lib(module: Any) -> None:
    """Replace the op functions of Horovod's TF library with timed ones. Not wrapt: AutoGraph
    warns about wrapt-decorated functions on every tf.function that calls them."""
    library = getattr(module, "MPI_LIB", None)
    tf = sys.modules.get("tensorflow")
    if library is None or tf is None:
        return
    for name, (op, grouped) in OPS.items():
        original = getattr(library, name, None)
        if original is None or getattr(original, "_tf_otel_original", None) is not None:
            continue
        setattr(library, name, _timed(original, collector.wrapper(op, grouped), tf))


def _timed(original: Callable, wrapper: Callable, tf: Any) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        return wrapper(original, None, args, kwargs)

    call.__name__ = getattr(original, "__name__", "horovod_op")
    call.__doc__ = original.__doc__
    timed = tf.autograph.experimental.do_not_convert(call)
    timed._tf_otel_original = original
    return timed


def _patch_optimizer(module: Any) -> None:
    if hasattr(module, "DistributedOptimizer"):
        wrap(module, "DistributedOptimizer", _check_optimizer)


def _handle_messages(pipeline: Any) -> None:
    pipeline.handlers.on_rank(messages.HVD_RECORDS, hook.on_message)
    pipeline.handlers.on_rank(messages.HVD_DONE, hook.on_done)
    pipeline.handlers.on_reference(messages.HVD_ARRIVALS, collector.on_arrivals)
    pipeline.handlers.on_rank(messages.HVD_LAST, collector.on_last)


def register() -> None:
    global _registered
    when_imported("horovod.common.basics", _patch_basics)
    when_imported("horovod.tensorflow.mpi_ops", _patch_mpi_lib)
    for module in ("horovod.tensorflow", "horovod.tensorflow.keras", "horovod.keras"):
        when_imported(module, _patch_optimizer)
    if _registered:
        return
    _registered = True
    add_step_hook(hook)
    from tf_otel.pipeline.lifecycle import with_pipeline

    with_pipeline(_handle_messages)
    collector.every = _settings().horovod_every
    collector.parts = parts_wanted(_settings().horovod_parts, collector.every)
    collector.enabled = hook.stamping
    from tf_otel.pipeline.lifecycle import before_shutdown

    before_shutdown(hook.finish)  # exit and SIGTERM: hand over the timeline's last records
    with fail_open("horovod.stale"):
        _remove_stale()


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
