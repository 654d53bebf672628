"""Pacing a background thread's Python to the CPU the training leaves idle: what the detail
twin's trace may use (detail_twin.py) without taking a core from the steps.

Usage::

    from tf_otel.instrument.cpu_pacer import Pacer
    pacer = Pacer()
    sys.setprofile(pacer)  # this thread only: it now sleeps whenever it is ahead of its share
    ...
    sys.setprofile(None)
    pacer.slept, pacer.share  # seconds it slept; its share of one core at the last look

    result = LOW_PRIORITY.run(work)  # work() on the nice-19 thread; its result or its error

A thread's *share* is how much of one core it may use, on average. Every half second the pacer
looks at the cores that sat idle (``SpareCpu``): with more than a quarter of a core idle the
share grows by a twentieth of a core, with less it halves (additive increase, multiplicative
decrease: ranks pacing themselves on one host, none knowing the others, settle below the idle
cores instead of all taking the same one), between ``FLOOR`` and ``CEILING``. On a machine the
training keeps busy (2 ranks on 2 cores) that is ``FLOOR``, a sixty-fourth of a core
(TF_OTEL_TWIN_CPU_FLOOR): the trace takes ~60x its CPU time and every step pays about that share
while it runs (a slice taken from any one replica or rank delays the whole synchronous step:
1/32 cost MirroredStrategy's steps 3.1 %, 1/64 1.1 %; docs/benchmarks/mirrored.md); where cores
sit idle (a GPU host), up to half a core. Where idle cores cannot be read the share is fixed at
``FALLBACK`` (an eighth of a core on 2 cores, up to half from 8).

Idle cores: the host's idle + iowait time from psutil (``cpu_times``); in a cgroup v2 with a
CPU limit (``cpu.max``, a Kubernetes limit), the limit less the group's own use (``cpu.stat``),
never more than the host's idle. Python is paced, not niced: a nice-19 thread that holds the GIL
while the OS runs others holds up every Python thread of its process. C++ work that lets go of
the GIL (the twin's instantiation) runs on ``LowPriority``'s thread at nice 19 instead: it only
takes cores nothing else wants (docs/guides/HOROVOD.md has the measurements).
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from pathlib import Path
from types import CodeType
from typing import Any, Callable, Optional, Tuple, TypeVar

from tf_otel.health import log_once

T = TypeVar("T")

FLOOR = 1 / 64  # share of one core when no core sits idle (TF_OTEL_TWIN_CPU_FLOOR: set_floor)
CEILING = 0.5  # at most half a core, however idle the machine
FALLBACK = min(0.5, max(0.125, (os.cpu_count() or 2) / 16))  # idle cores unknown
HEADROOM = 0.25  # idle cores left to the training's own bursts
RAISE = 0.05  # share added at a look that found more idle cores than the headroom
BACKOFF = 0.5  # what a look that found fewer keeps of the share used
WINDOW_S = 0.5  # seconds between two looks at the idle cores
BURST_S = 0.02  # CPU seconds a thread may run ahead after having slept more than it needed
MAX_SLEEP_S = 1.0
_EVERY = 4095  # profile events between two looks at the thread's CPU time (a mask)
CGROUP = Path("/sys/fs/cgroup")


class Abandoned(BaseException):
    """Raised into a paced thread's Python once its work is given up (the program exits): the
    twin's trace ends there instead of the program waiting for it. A BaseException, so that the
    program's own ``except Exception`` inside a traced function does not swallow it."""


# Where Abandoned may be raised: as a plain function starts (the same as that function raising
# on its first line, which any caller meets already), never anywhere inside a context manager's
# enter or exit (TensorFlow's tf_stack pushes onto a per-thread stack in __enter__ and then calls
# update(): raised below that, the stack is left unbalanced, the next __exit__ asserts
# "Concurrent access?" and the thread can be left in a graph's context), nor as a generator
# resumes (its own finally would run half-entered).
_UNSAFE_NAMES = frozenset({"__enter__", "__exit__", "__aenter__", "__aexit__", "__del__"})
_GENERATOR_FLAGS = 0x20 | 0x80 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR


def may_raise_here(frame: Any, within: Optional[CodeType] = None) -> bool:
    """At a profile 'call' event for ``frame``: may the pacer raise Abandoned into it? Walks
    the thread's stack (only after the work was given up, until the first such call); with
    ``within``, only while that code runs further up."""
    if frame.f_code.co_flags & _GENERATOR_FLAGS:
        return False
    inside = within is None
    while frame is not None:
        code = frame.f_code
        if code.co_name in _UNSAFE_NAMES:
            return False
        inside = inside or code is within
        frame = frame.f_back
    return inside


# A call the pacer raises into may be a finalizer (a __del__ under another name, a weakref
# callback) run by the garbage collector or a reference dropped: Python then reports the error
# as unraisable, swallows it and the thread's profile function is gone, so the work would go on
# unpaced. The hook (installed with the first abandonment, chained to the one before) puts this
# thread's stopped pacer back instead: it raises again at the next plain call, without a word.
_stopped_here = threading.local()
_previous_hook: Optional[Callable[[Any], Any]] = None


def _unraisable(unraisable: Any) -> None:
    if isinstance(unraisable.exc_value, Abandoned):
        pacer = getattr(_stopped_here, "pacer", None)
        if pacer is not None:
            sys.setprofile(pacer)
        return
    (_previous_hook or sys.__unraisablehook__)(unraisable)


def _rearm_when_swallowed(pacer: Pacer) -> None:
    global _previous_hook
    _stopped_here.pacer = pacer
    if sys.unraisablehook is not _unraisable:
        _previous_hook = sys.unraisablehook
        sys.unraisablehook = _unraisable


class SpareCpu:
    """Idle cores since the previous call (None at the first call or where unknown)."""

    def __init__(self, cgroup: Path = CGROUP, host: Optional[Callable[[], float]] = None) -> None:
        self.limit = _cgroup_limit(cgroup)  # cores, or None: no CPU limit on this group
        self.cgroup = cgroup
        self.host = host or _host_idle_s
        self.last: Optional[Tuple[float, float, float]] = None  # (wall, host idle, group use)

    def prime(self) -> bool:
        """Take the first reading: False where idle cores cannot be read here."""
        self.last = self._read()
        return self.last is not None

    def cores(self) -> Optional[float]:
        now = self._read()
        last, self.last = self.last, now
        if now is None:
            return None
        if last is None or now[0] <= last[0]:
            return None
        wall = now[0] - last[0]
        idle = max(0.0, (now[1] - last[1]) / wall)
        if self.limit is not None:
            idle = min(idle, max(0.0, self.limit - (now[2] - last[2]) / wall))
        return idle

    def _read(self) -> Optional[Tuple[float, float, float]]:
        try:
            return (time.monotonic(), self.host(), self._group_used_s())
        except Exception:  # noqa: BLE001 - unreadable: unknown, the fixed share applies
            return None

    def _group_used_s(self) -> float:
        if self.limit is None:
            return 0.0
        for line in (self.cgroup / "cpu.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "usage_usec":
                return int(value) / 1e6
        raise ValueError("cpu.stat has no usage_usec")


def _host_idle_s() -> float:
    import psutil

    times = psutil.cpu_times()
    return float(times.idle + getattr(times, "iowait", 0.0))


def _cgroup_limit(cgroup: Path) -> Optional[float]:
    """Cores a cgroup v2 ``cpu.max`` allows ("max 100000": none; "200000 100000": 2)."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def set_floor(share: float) -> None:
    """The share of one core where no core sits idle, for pacers made from now on (and every
    next window's share), at most ``CEILING``."""
    global FLOOR
    FLOOR = min(CEILING, max(share, 1e-6))


def next_share(used: float, spare: Optional[float]) -> float:
    """The share for the next window, from the share of one core used in the last one and the
    idle cores in it (None: unknown). What was used, not what was allowed, is what the idle
    cores came after."""
    if spare is None:
        return FALLBACK
    share = used + RAISE if spare > HEADROOM else used * BACKOFF
    return min(CEILING, max(FLOOR, share))


class Pacer:
    """A ``sys.setprofile`` function: every few thousand Python calls it compares the thread's
    CPU time with its share of the wall time since the previous look and sleeps (letting go of
    the GIL and the core) while the thread is ahead; every ``WINDOW_S`` it sets a new share.
    Once ``stop()`` says so it raises ``Abandoned`` into the paced code as the next plain
    function starts (``may_raise_here``); a pacer with ``raises=False`` (a thread the work
    started, whose starter raises once it is back in Python) just stops pacing."""

    def __init__(
        self,
        spare: Optional[SpareCpu] = None,
        stop: Callable[[], bool] = lambda: False,
        raises: bool = True,
        within: Optional[CodeType] = None,
    ) -> None:
        self.spare = spare if spare is not None else SpareCpu()
        self.stop = stop  # True: abandon the paced work (the program exits)
        self.raises = raises
        self.within = within  # raising only while this code runs (a thread's own work)
        self.stopped = False  # stop() said so: raising at the next safe call, or not pacing
        self.share = FLOOR if self.spare.prime() else FALLBACK
        self.events = 0
        self.slept = 0.0
        self.ahead = 0.0  # CPU seconds allowed and not used (negative: used beyond the share)
        self.last = (time.monotonic(), time.thread_time())
        self.window = self.last

    def fork(self, within: Optional[CodeType] = None) -> Pacer:
        """A pacer for a thread this one's work started: its own CPU clock and idle-core
        readings, starting at this pacer's share, stopping when this one does. It raises only
        while ``within`` runs (the function the thread was started for, whose errors the
        thread's owner hands back to the starter: MirroredStrategy's replica threads); without
        it, it just stops pacing and the starter raises once it is back in Python."""
        child = Pacer(stop=self.stop, raises=within is not None, within=within)
        child.share = self.share
        return child

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if self.stopped:
            if self.raises and event == "call" and may_raise_here(frame, self.within):
                # into the paced code (Python then unsets this profile function): its work ends
                raise Abandoned()
            return
        self.events += 1
        if self.events & _EVERY:
            return
        if self.stop():
            self.stopped = True
            if self.raises:
                _rearm_when_swallowed(self)
            return
        self.look(time.monotonic(), time.thread_time())

    def look(self, wall: float, cpu: float) -> float:
        """Account the time since the previous look; sleep while ahead. Returns the sleep."""
        if wall - self.window[0] >= WINDOW_S:
            used = (cpu - self.window[1]) / (wall - self.window[0])
            self.share = next_share(used, self.spare.cores())
            self.window = (wall, cpu)
        self.ahead += self.share * (wall - self.last[0]) - (cpu - self.last[1])
        self.ahead = min(self.ahead, BURST_S)
        self.last = (wall, cpu)
        if self.ahead >= -0.01:
            return 0.0
        pause = min(-self.ahead / self.share, MAX_SLEEP_S)
        self.slept += pause
        time.sleep(pause)
        return pause


class LowPriority:
    """One daemon thread at nice 19 (Linux: a thread's own nice value) that runs the work it is
    given, one at a time, while the caller waits. For C++ that lets go of the GIL: the thread
    holds the GIL only at the work's edges (a nice-19 thread holding it while starved would
    hold up every Python thread). Where the nice value cannot be set the thread runs at the
    process's priority, said once."""

    NICE = 19

    def __init__(self, name: str) -> None:
        self.name = name
        self.jobs: queue.Queue[Tuple[Callable[[], Any], _Box]] = queue.Queue()
        self.thread: Optional[threading.Thread] = None
        self.lock = threading.Lock()
        self.niced: Optional[bool] = None  # once the thread runs: did the nice value take?

    def run(self, work: Callable[[], T]) -> T:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self.thread.start()
        box = _Box()
        self.jobs.put((work, box))
        box.done.wait()
        if box.error is not None:
            raise box.error
        return box.value

    def _loop(self) -> None:
        self.niced = _nice_this_thread(self.NICE)
        if not self.niced:
            log_once(
                "low_priority_not_niced",
                "tf_otel: could not lower the priority of thread %s; it runs at the process's",
                self.name,
                level=logging.INFO,
            )
        while True:
            work, box = self.jobs.get()
            try:
                box.value = work()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box.error = exc
            finally:
                box.done.set()


class _Box:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: Optional[BaseException] = None


def _nice_this_thread(nice: int) -> bool:
    """Lower this thread's priority (Linux: PRIO_PROCESS with a thread id is that thread only;
    lowering needs no privilege, raising it back would)."""
    if sys.platform != "linux":  # elsewhere a thread id is not a PRIO_PROCESS target
        return False
    try:
        tid = threading.get_native_id()
        if tid == os.getpid():  # the process's main thread: that would nice the process
            return False
        os.setpriority(os.PRIO_PROCESS, tid, nice)
        return os.getpriority(os.PRIO_PROCESS, tid) == nice
    except (AttributeError, OSError):
        return False


LOW_PRIORITY = LowPriority("tf_otel-low-priority")
