"""Detail-step twins of the program's tf.functions: timing ops live only in a second trace of the
program's own function, run on the detailed steps; every other step runs exactly the program's
graph, so collective detail has no standing cost.

Usage::

    from tf_otel.instrument import detail_twin
    detail_twin.wanted_by(lambda: True)  # a source wants timing ops (e.g. the Horovod stamps)
    if detail_twin.ready_for(key, step): ...  # step hook: may this picked step run the twin?
    detail_twin.want(True)  # step hook, on a detail step's start
    result = detail_twin.call(function, wrapped, args, kwargs)  # where the step calls it
    if detail_twin.tracing(): ...  # graph construction: inside a twin's trace?
    detail_twin.want(False)  # the step's end
    detail_twin.reported_by(send)  # a source tells rank 0 "prepared generations [g, ...]"
    detail_twin.open([g], {key: first_step})  # rank 0: generation g runs from there
    g = detail_twin.prepare_later(work)  # another source's preparation (TF1 graph stamps' runs)
    if detail_twin.is_open(g): ...  # that source, on a detail step: may it use it?

A twin is ``Function._clone``: the same Python function and options, its own traces; nested
tf.functions are swapped for their own twins while it traces. It is traced and instantiated on
the ``tf_otel-twin`` thread (the slow part of a first run: 7.6 s against 0.29 s MobileNetV3Small
steps, so no training step pays for it), the trace's Python paced to the CPU the training leaves
idle (cpu_pacer.py), instantiated at nice 19 by a call with an already-cancelled cancellation
manager: TensorFlow instantiates the function and runs none of its ops, so a preparation is
never a run ahead of the program. Preparations are taken newest first; a trace under way gives
way to a newer trace of its function (prepared after it). A picked step runs the twin of the
trace its call hits (TensorFlow's function-cache lookup, no trace) only once every rank has
prepared that generation, from a step rank 0 names (detail_twin_gate.py), so a step runs it on
every rank or on none; otherwise it runs the program's own function, and arguments no trace had
queue a twin instead of tracing one on the step. Without a reporter (no pipeline, tests) a
generation opens once prepared. At the program's exit a trace under way is abandoned. Tracing
from a second thread is safe (each Function traces under its own lock) and the twin is its own
Function, so the program's function never waits for it. A twin that fails to prepare is given
up (logged once) and the program's function runs instead. Design, pacing and costs:
docs/guides/HOROVOD.md.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from opentelemetry import context as otel_context

from tf_otel.health import count, fail_open, log_once, report_failure
from tf_otel.instrument import cpu_pacer, twin_tf

_OWN_MODULE = "tf_otel"
THREAD_NAME = "tf_otel-twin"
MAX_PENDING = 16  # preparations queued at most (one per trace of a program's function)
MAX_KEYS = 64  # step keys whose last step is kept (rank 0's choice of the first detail step)
RESEND_S = (1.0, 5.0)  # a prepared generation not opened yet is reported again, backing off
IDLE_S = 5.0  # the twin thread looks again this often with nothing queued
# at the program's exit a trace under way is abandoned (cpu_pacer.Abandoned) and an instantiation
# under way let finish for at most this long: a daemon thread still inside TensorFlow's C++ when
# the interpreter finalises is ended by a forced unwind that TensorFlow's catch-all handlers
# abort the whole process on
EXIT_WAIT_S = 60.0
QUIET_EXIT_S = 2.0  # waited at exit before saying why (an abandoned trace ends well within)


class _TwinState(threading.local):
    wanted = False  # this thread's running step is a detail step
    tracing = 0  # > 0 inside a twin's call (its trace, and tf.functions traced within it)
    ran_own = False  # this detail step ran the program's function: its first call (see call)
    every_step = False  # every step is a detail step (TF_OTEL_HOROVOD_EVERY=1)
    pacer: Optional[cpu_pacer.Pacer] = None  # pacing this thread's trace of a twin
    # generations this detail step may run (ready_for); None: every one (nothing was queued)
    open_now: Optional[FrozenSet[int]] = None


_state = _TwinState()

_sources: List[Callable[[], bool]] = []  # does a source want timing ops now?
_in_background = True  # TF_OTEL_TWIN_PREPARE=background (prepare_where)
_after: List[Callable[[], None]] = []  # what sources build once a twin is prepared


def wanted_by(source: Callable[[], bool]) -> None:
    """A source of timing ops (once per process): twins are traced while it says so."""
    if source not in _sources:
        _sources.append(source)


def prepare_where(twin_prepare: str, cpu_floor: float) -> None:
    """TF_OTEL_TWIN_PREPARE: ``background`` (on the twin thread) or ``step`` (on the step that
    traced the program's function); TF_OTEL_TWIN_CPU_FLOOR: the background trace's share of a
    core where none sits idle."""
    global _in_background
    _in_background = twin_prepare != "step"
    cpu_pacer.set_floor(cpu_floor)


def after_prepare(build: Callable[[], None]) -> None:
    """What a source builds for its detail steps once a twin is prepared (e.g. the stamps'
    reader), on the same thread, before the generation counts as prepared (once per process)."""
    if build not in _after:
        _after.append(build)


def preparing() -> bool:
    """A twin queued here is not prepared yet (sources leave what it adds alone meanwhile)."""
    return len(_gate.prepared) < _gate.queued


def enabled() -> bool:
    return any(source() for source in _sources)


def want(on: bool, every_step: bool = False) -> None:
    """A detail step starts (True) or ends (False) on this thread. ``every_step``: every step
    is a detail step, so a first call traces the twin on its step (the program's own function
    may never run) instead of running the program's (see ``call``)."""
    _state.wanted = on
    _state.every_step = on and every_step
    _state.ran_own = False
    if not on:
        _state.open_now = None  # what ready_for found holds for the step it was asked for


def ran_own_function() -> bool:
    """The detail step under way ran the program's own function, not a twin: it was the
    function's first call, which traces it (the twin is prepared beside it, in the background).
    The step has no timing ops; it says so on its span like a step whose twin is preparing."""
    return _state.ran_own


def pacer_here() -> Optional[cpu_pacer.Pacer]:
    """The pacer of the twin's trace under way on this thread (threads it starts are paced
    too: twin_threads.py), or None."""
    return _state.pacer


def tracing() -> bool:
    """Graph construction on this thread belongs to a twin: timing ops go in."""
    return _state.tracing > 0


_BROKEN = False  # a function whose twin failed to trace: it runs as the program's own


def _twin_of(function: Any) -> Any:
    """The function's twin (made once), or None where it cannot be made or traced."""
    twin = getattr(function, "_tf_otel_twin", None)
    if twin is None:
        twin = _BROKEN
        with fail_open("twin.make"):
            twin = function._clone(None)
            twin._tf_otel_twin_of = function
            count("twin_functions")
        function._tf_otel_twin = twin
    return None if twin is _BROKEN else twin


def _traced(function: Any, twin: Any, args: tuple, kwargs: dict) -> Any:
    """Trace (or find) the twin's graph for these arguments before it runs: its concrete
    function, or None for a twin that cannot be traced (e.g. it would create variables), given
    up once so the program's own function runs; errors while running a traced twin are the
    program's own and propagate."""
    _state.tracing += 1
    try:
        return twin.get_concrete_function(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        pacer = _state.pacer
        if pacer is not None and (pacer.stopped or pacer.stop()):
            # given up meanwhile: whatever TensorFlow made of Abandoned on its way out (through
            # pybind11, a replica thread's error handling) is the abandonment, not a twin that
            # cannot be traced
            raise cpu_pacer.Abandoned() from exc
        function._tf_otel_twin = _BROKEN
        report_failure("twin.trace", exc)
        return None
    finally:
        _state.tracing -= 1


def _is_own(function: Any) -> bool:
    python_function = getattr(function, "_python_function", None)
    return (getattr(python_function, "__module__", "") or "").startswith(_OWN_MODULE)


def _run_twin(function: Any, twin: Any, args: tuple, kwargs: dict) -> Any:
    _state.tracing += 1
    try:
        return twin(*args, **kwargs)
    finally:
        _state.tracing -= 1


def call(function: Any, wrapped: Callable, args: tuple, kwargs: dict, top: bool) -> Any:
    """Call a tf.function the program called: its twin on a detail step's top-level call and
    inside a twin's trace, else the program's own (preparing the twin in the background after
    a new trace of it). ``top``: the step's own call of its function (not a nested call)."""
    if _is_own(function) or getattr(function, "_tf_otel_twin_of", None) is not None:
        return wrapped(*args, **kwargs)
    if _state.tracing:
        twin = _twin_of(function)
        if twin is not None:
            return _run_twin(function, twin, args, kwargs)
        return wrapped(*args, **kwargs)
    counter = getattr(function, "experimental_get_tracing_count", None)
    if (
        top
        and _state.wanted
        and not _state.every_step
        and _in_background
        and counter is not None
        and counter() == 0
    ):
        # the function's first call: run the program's own, which traces it, and prepare the
        # twin beside it (a twin traced here would leave the program's trace to a later step)
        _state.ran_own = True
    elif top and _state.wanted:
        twin = _twin_of(function)
        if twin is not None:
            if not _state.every_step and _in_background:
                found = twin_tf.cached(twin, args, kwargs)
                if found is twin_tf.UNKNOWN:  # the trace it hits is unknown: every one open
                    ready = _state.open_now is None or len(_state.open_now) >= _gate.queued
                else:
                    generation = getattr(found, "_tf_otel_generation", None)
                    ready = found is not None and is_open(generation)
                if not ready:
                    # its twin for these arguments is not prepared on every rank yet (a last
                    # partial batch, a newer trace): the program's own, and the twin prepared
                    missing = found is None
                    return _run_own(function, wrapped, args, kwargs, missing=missing)
            before = twin.experimental_get_tracing_count()
            if _traced(function, twin, args, kwargs) is not None:
                if twin.experimental_get_tracing_count() != before:
                    # arguments no trace of the program had yet: traced on this step
                    count("twin_traced_on_step")
                return _run_twin(function, twin, args, kwargs)
        return wrapped(*args, **kwargs)
    if not top or counter is None or not enabled():
        return wrapped(*args, **kwargs)
    before = counter()
    result = wrapped(*args, **kwargs)
    if counter() != before:
        _prepare_later(function, args, kwargs)
    return result


MAX_ASKED = 4  # preparations a function's detail steps queue for traces the program had


def _run_own(function: Any, wrapped: Callable, args: tuple, kwargs: dict, missing: bool) -> Any:
    """A detail step whose twin is not ready for its arguments runs the program's own function
    (and says so); a twin the arguments have none of is queued for preparation."""
    _state.ran_own = True
    counter = function.experimental_get_tracing_count
    before = counter()
    result = wrapped(*args, **kwargs)
    if missing and enabled():
        asked = getattr(function, "_tf_otel_asked", 0)
        if counter() != before:  # the program traced these arguments now
            _prepare_later(function, args, kwargs)
        elif asked < MAX_ASKED:  # a trace the program had before its twin was wanted
            function._tf_otel_asked = asked + 1
            _prepare_later(function, args, kwargs)
    return result


# -- preparation off the training thread ----------------------------------------------------


# another source's preparation, given its generation: its Python part (paced like a trace)
# returns what is left to do in TensorFlow's C++ (run at low priority), or None
Work = Callable[[int], Optional[Callable[[], None]]]


@dataclass
class _Job:
    function: Any
    twin: Any
    args: tuple
    kwargs: dict
    generation: int
    device: str = ""  # the training thread's device scope at the call (tf.device)
    # the OpenTelemetry context of the step that traced (step_context.pinned_context): what
    # the program's Python makes while its twin traces lands in that step's trace
    context: Any = None
    work: Optional[Work] = None  # not a twin: another source's preparation
    superseded: bool = False  # a newer trace of its function was queued while it traced


class _Gate:
    """Generations queued (training thread), prepared (the twin thread) and opened (rank 0's
    answer), the step keys' last steps, and the preparation thread itself. Preparations are
    taken newest first (the trace the program calls now); a twin's trace still under way when
    a newer trace of the same function is queued is set aside for it (Horovod's
    ``first_batch=True`` trace, which the program calls once, then the steady one)."""

    def __init__(self) -> None:
        self.queued = 0
        self.prepared: Set[int] = set()  # generations prepared here
        # generation -> {step key: first step} from rank 0; replaced whole, never mutated
        self.opened: Dict[int, Dict[str, int]] = {}
        self.last_steps: Dict[str, int] = {}
        self.reporters: List[Callable[[List[int]], Any]] = []
        self.prepared_on: List[str] = []  # thread names that prepared (tests; bounded)
        self.pending: List[_Job] = []  # queued, not started (the twin thread takes the last)
        self.current: Optional[_Job] = None  # the preparation under way
        self.thread: Optional[threading.Thread] = None
        self.changed = threading.Condition()
        self.busy = False  # a preparation is under way on the twin thread
        self.stopping = False  # the program is exiting: no preparation starts

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
            self.thread.start()
            atexit.register(self.stop)

    def put(self, job: _Job) -> bool:
        with self.changed:
            if len(self.pending) >= MAX_PENDING:
                return False
            current = self.current
            if (
                current is not None
                and current.function is not None
                and current.function is job.function
            ):
                current.superseded = True  # its trace gives way at its pacer's next look
            self.pending.append(job)
            self.changed.notify_all()
        return True

    def stop(self, wait_s: float = EXIT_WAIT_S) -> bool:
        """At exit: start no more preparations; a trace under way is abandoned at its next
        look at the pacer (Python), an instantiation under way (TensorFlow's C++, which cannot
        be interrupted) let finish. False when that outlasted ``wait_s``."""
        with self.changed:
            self.stopping = True
            self.changed.notify_all()
            quiet = min(QUIET_EXIT_S, wait_s)  # a trace is abandoned within this
            finished = self.changed.wait_for(lambda: not self.busy, timeout=quiet)
            if not finished:
                log_once(
                    "twin_exit_wait",
                    "tf_otel: the program exits while TensorFlow instantiates a detail twin; "
                    "letting it finish (at most %.0f s)",
                    wait_s,
                    level=logging.WARNING,
                )
                left = wait_s - quiet
                finished = self.changed.wait_for(lambda: not self.busy, timeout=left)
        if not finished:
            count("twin_exit_wait_exceeded")
        return finished

    def _unopened(self) -> bool:
        return bool(self.prepared - self.opened.keys())

    def _loop(self) -> None:
        # not niced: a thread at nice 19 that holds the GIL while the OS runs others holds up
        # every Python thread of the process (a 2-rank MobileNetV2 job's steps took 3-4x)
        wait_s = RESEND_S[0]
        while True:
            with self.changed:
                if not self.pending and not self.stopping:
                    self.changed.wait(wait_s if self._unopened() else IDLE_S)
                if self.stopping:
                    return
                job = self.pending.pop() if self.pending else None
                self.current = job
                self.busy = job is not None
            if job is not None:
                prepared = True
                try:
                    with fail_open("twin.prepare"):
                        _prepare(job)
                except cpu_pacer.Abandoned:  # the program exits, or a newer trace came
                    prepared = False
                with self.changed:
                    self.current = None
                    if prepared:
                        self.prepared.add(job.generation)
                        job.args = job.kwargs = None  # type: ignore[assignment]  # the batch
                    elif self.stopping:
                        count("twin_abandoned_at_exit")
                    else:  # set aside for the newer trace, prepared after it
                        count("twin_superseded")
                        job.superseded = False
                        self.pending.insert(0, job)
                    self.busy = False
                    self.changed.notify_all()
                wait_s = RESEND_S[0]
            elif self._unopened():
                wait_s = RESEND_S[1]
            if self._unopened():
                self._report(sorted(self.prepared))

    def _report(self, generations: List[int]) -> None:
        if not self.reporters:
            self.open(generations, {})  # nobody to agree with: open here
            return
        for reporter in list(self.reporters):
            with fail_open("twin.report"):
                reporter(generations)

    def open(self, generations: Iterable[int], starts: Dict[str, int]) -> None:
        with self.changed:
            opened = dict(self.opened)
            for generation in generations:
                opened.setdefault(int(generation), dict(starts))
            self.opened = opened
            self.changed.notify_all()


_gate = _Gate()


def _prepare_later(function: Any, args: tuple, kwargs: dict) -> None:
    """The program's function was traced on this call: prepare its twin for the same arguments
    on the twin thread, so a later detail step runs a traced, instantiated graph."""
    twin = _twin_of(function)
    if twin is None:
        return
    if not _in_background:  # TF_OTEL_TWIN_PREPARE=step: here, on the step that traced
        with fail_open("twin.prepare"):
            _prepare(_Job(function, twin, args, kwargs, 0))
        return
    job = _Job(function, twin, tuple(args), dict(kwargs), 0, twin_tf.device_scope())
    with fail_open("twin.context"):
        from tf_otel.instrument.step_context import pinned_context

        job.context = pinned_context()
    _enqueue(job)


def prepare_later(work: Work) -> Optional[int]:
    """Another source's preparation for its detail steps (TF1 graph stamps' runs): queued as a
    generation of its own, which picked steps wait for on every rank like a twin's (``is_open``).
    Its generation; 0 where it was done here (TF_OTEL_TWIN_PREPARE=step: always open); None
    where the queue is full (that source's detail steps prepare it themselves)."""
    if not _in_background:  # TF_OTEL_TWIN_PREPARE=step: here, on the step
        with fail_open("twin.prepare"):
            _prepare(_Job(None, None, (), {}, 0, work=work))
        return 0
    job = _Job(None, None, (), {}, 0, work=work)
    return job.generation if _enqueue(job) else None


def _enqueue(job: _Job) -> bool:
    generation = _gate.queued + 1
    _gate.queued = generation  # before the job is queued: the gate closes first, never after
    job.generation = generation
    if not _gate.put(job):
        _gate.queued = generation - 1
        count("twin_prepare_dropped")  # its detail steps trace and instantiate it themselves
        return False
    _gate.start()
    return True


def _prepare(job: _Job) -> None:
    """On the twin thread: trace the twin, then have TensorFlow instantiate it without running
    it. A twin that cannot be traced is given up; one that cannot be instantiated here still
    runs (instantiated by its first detail step)."""
    if job.work is not None:
        _prepare_work(job.work, job.generation)
        return
    token = otel_context.attach(job.context) if job.context is not None else None
    try:
        _prepare_in_context(job)
    finally:
        if token is not None:
            otel_context.detach(token)


def _prepare_in_context(job: _Job) -> None:
    started = time.monotonic()
    before = job.twin.experimental_get_tracing_count()
    # paced on the twin thread (not on TF_OTEL_TWIN_PREPARE=step's step); abandoned at exit
    pacer = (
        cpu_pacer.Pacer(stop=lambda: _gate.stopping or job.superseded)
        if job.generation > 0
        else None
    )
    if pacer is not None:
        sys.setprofile(pacer)  # this thread only
        _state.pacer = pacer
    try:
        with twin_tf.device(job.device):  # the call's device scope: part of tf.function's cache key
            concrete = _traced(job.function, job.twin, job.args, job.kwargs)
    finally:
        if pacer is not None:
            sys.setprofile(None)
            _state.pacer = None
    _note_thread()
    if concrete is None:
        return
    with fail_open("twin.generation"):
        concrete._tf_otel_generation = job.generation  # detail calls run it once it is open
    if job.twin.experimental_get_tracing_count() != before:
        count("twin_traces")
    traced = time.monotonic()
    try:
        if pacer is not None:  # TensorFlow's C++, off the GIL: on cores nothing else wants
            cpu_pacer.LOW_PRIORITY.run(
                lambda: twin_tf.instantiate(concrete, job.args, job.kwargs, job.device)
            )
        else:
            twin_tf.instantiate(concrete, job.args, job.kwargs, job.device)
        count("twin_instantiated")
    except Exception as exc:  # noqa: BLE001
        report_failure("twin.instantiate", exc)
    for build in list(_after):
        with fail_open("twin.after_prepare"):
            build()
    done = time.monotonic()
    log_once(
        "twin_prepared",
        "tf_otel: detail twin prepared off the training thread (trace %.2f s, %.2f s of it "
        "paced to the idle CPU, instantiation %.2f s)",
        traced - started,
        pacer.slept if pacer is not None else 0.0,
        done - traced,
        level=logging.DEBUG,
    )


def _prepare_work(work: Work, generation: int) -> None:
    """Another source's preparation: its Python paced like a trace, its C++ at low priority."""
    pacer = cpu_pacer.Pacer(stop=lambda: _gate.stopping) if generation > 0 else None
    if pacer is not None:
        sys.setprofile(pacer)
    try:
        native = work(generation)
    finally:
        if pacer is not None:
            sys.setprofile(None)
    _note_thread()
    if native is None:
        return
    if pacer is not None:
        cpu_pacer.LOW_PRIORITY.run(native)
    else:
        native()


def _note_thread() -> None:
    if len(_gate.prepared_on) < 64:
        _gate.prepared_on.append(threading.current_thread().name)


# -- which picked steps may run the twin ----------------------------------------------------


def note_step(key: str, step: int) -> None:
    """Training thread, every step: its key's last step (rank 0 picks first steps past it)."""
    steps = _gate.last_steps
    if key in steps or len(steps) < MAX_KEYS:
        steps[key] = step


def ready_for(key: str, step: int) -> bool:
    """May this picked step run twins? Yes when no twin was ever queued, or when some generation
    is prepared on every rank and open for this key at this step (rank 0's first step for it);
    which of them the step's call may run is ``is_open``'s answer for its trace. The same
    answers on every rank (see the module's docstring)."""
    if _gate.queued == 0:
        _state.open_now = None
        return True
    opened = _gate.opened
    _state.open_now = frozenset(
        generation
        for generation, starts in opened.items()
        if step >= starts.get(key, step)  # a key rank 0 had not stepped: at once
    )
    return bool(_state.open_now)


def is_open(generation: Optional[int]) -> bool:
    """May the detail step under way on this thread run what generation ``generation``
    prepared (0: prepared on its step; None: not prepared ahead, always)? Its trace or run is
    prepared on every rank and open at this step."""
    open_now = _state.open_now
    return not generation or open_now is None or generation in open_now


def reported_by(reporter: Callable[[List[int]], Any]) -> None:
    """A way to tell rank 0 "these generations are prepared here" (once per process); called
    on the twin thread, again every few seconds while one of them is not open."""
    if reporter not in _gate.reporters:
        _gate.reporters.append(reporter)


def open(generations: Iterable[int], starts: Dict[str, int]) -> None:  # noqa: A001 - the verb
    """Rank 0's answer: ``generations`` are prepared on every rank; picked steps of each key in
    ``starts`` run them from that step on (other keys at once)."""
    _gate.open(generations, starts)


def last_steps() -> Dict[str, int]:
    """Each step key's last step begun here (rank 0 chooses first detail steps past these)."""
    return dict(_gate.last_steps)


def generations() -> Tuple[int, int, int]:
    """(queued, prepared, opened) generations of this process."""
    return _gate.queued, len(_gate.prepared), len(_gate.opened)


def wait_open(timeout_s: float) -> bool:
    """Wait until every generation queued so far is open (tests, benches); never from a
    training thread."""
    deadline = time.monotonic() + timeout_s
    with _gate.changed:
        while len(_gate.opened) < _gate.queued:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _gate.changed.wait(left)
    return True


def prepared_on() -> List[str]:
    """Names of the threads that prepared twins (tests: never the training thread)."""
    return list(_gate.prepared_on)
