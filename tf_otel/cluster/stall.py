"""Stalls: rank 0 names the rank that holds a step, while the job still runs.

Every rank knows its step in flight and its last completed step per key (``StepTracker``: the
training thread only stores a field at step begin and end). On rank 0 a watch thread
(``tf_otel-stall``, never the training thread) looks once a second at rank 0's own step in
flight; past the threshold, max(``TF_OTEL_STALL_FLOOR_S``, ``TF_OTEL_STALL_FACTOR`` x the median
of the key's recent steps), it asks every rank "where are you" over the authenticated
coordinator channel (``messages.STALL_ASK``). Each rank answers from its coordinator reader
thread (``messages.STALL_WHERE``: its step in flight, its last completed step, its training
thread's Python stack: function, file, line, never a value) and exports its step in flight as a
span marked ``tf_otel.step.in_flight``, ended now, flushed at once. Rank 0 waits up to
ANSWER_WAIT_S, then exports the stall record: a span of category ``stall`` in the step's trace
(child of the step's root span id) and a WARNING log record of logger ``tf_otel`` in that trace
(once on stderr, stderr_once.py), naming the ranks that have not reached the step, where the ranks
inside it wait, and who did not answer. Repeated at threshold x 2, x 4 ... while the step stays
in flight; when it ends, one ``resolved`` record says how long the step took (a slow step).
Rank 0 outside any step for a threshold probes the ranks (``"x": 0``: no stack, nothing
exported); a step the others have been in for a threshold that rank 0 has not begun stalls on
rank 0 itself, reported the same way. The record's text and attributes: cluster.stall_record.

Usage (done by runtime.steps.Pipeline)::

    tracker = StepTracker(durations=True)            # begin(handle) / end(handle): training thread
    register(pipeline)                               # every rank: answers rank 0's question
    watch = StallWatch(pipeline, Policy(20.0, 10.0)); watch.start()   # rank 0
"""

from __future__ import annotations

import itertools
import logging
import os
import statistics
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

from tf_otel import clock, record
from tf_otel.cluster import messages
from tf_otel.cluster.stall_record import (
    ANSWER_WAIT_S,
    StallRecord,
    build_record,
    resolved_record,
)
from tf_otel.cluster.step_collectives import StepCollectives
from tf_otel.health import count, fail_open
from tf_otel.otel.ids import step_trace_id
from tf_otel.otel.trace_log import log_in_trace
from tf_otel.step_handle import StepHandle

WARMUP_STEPS = 3  # until this many steps of a key completed, the threshold is the warm-up one
WARMUP_FLOOR_FACTOR = 6  # warm-up threshold = 6 x the floor (first steps trace and compile)
DURATIONS_KEPT = 64  # recent step durations per key, for the median
MAX_KEYS = 64  # step keys remembered (last completed step, durations)
CHECK_INTERVAL_S = 1.0
BACKOFF = 2.0  # report k is due at threshold x BACKOFF**(k-1) of the step's age
MAX_REPORT_GAP_S = 1800.0


class Policy:
    """The stall threshold of a step, from the recent completed steps of its key."""

    def __init__(self, floor_s: float, factor: float) -> None:
        self.floor_ns = int(floor_s * 1e9)
        self.factor = factor

    def threshold_ns(self, durations: Sequence[int]) -> int:
        """max(floor, factor x median); before WARMUP_STEPS steps of the key completed, the
        warm-up threshold WARMUP_FLOOR_FACTOR x floor (the first steps trace and compile)."""
        if len(durations) < WARMUP_STEPS:
            return self.floor_ns * WARMUP_FLOOR_FACTOR
        return max(self.floor_ns, int(self.factor * statistics.median(durations)))


# (file, function) where TensorFlow builds a graph: a (re)trace, legitimately slow. Not the file
# alone: tracing_compilation.call_function is on the stack of every tf.function call
_TRACING = (
    (os.path.join("tensorflow", "python", "framework", "func_graph.py"), "func_graph_from_py_func"),
    (
        os.path.join(
            "tensorflow", "python", "eager", "polymorphic_function", "tracing_compilation.py"
        ),
        "_create_concrete_function",
    ),
)


def is_tracing(stack: Sequence[Sequence[Any]]) -> bool:
    """A stack inside TensorFlow's tracing of a function (a first call, a new input signature,
    the first call of a detail twin): such a step gets the warm-up threshold."""
    return any(
        frame[0] == function and str(frame[1]).endswith(path)
        for frame in stack
        for path, function in _TRACING
    )


def report_due_ns(threshold_ns: int, report: int) -> int:
    """The age of a stalled step at which its report number ``report`` (1, 2, ...) is due:
    threshold, 2 x threshold, 4 x ... (BACKOFF), two reports at most MAX_REPORT_GAP_S apart."""
    due = threshold_ns
    cap = int(MAX_REPORT_GAP_S * 1e9)
    for _ in range(report - 1):
        due += max(1, min(cap, int(due * (BACKOFF - 1))))
    return due


class _Done(NamedTuple):
    """A completed step, as the stall readers see it."""

    key: str
    step: int
    end_ns: int
    thread: int  # the training thread: its stack is where a rank between steps is


class StepTracker:
    """A rank's steps in flight (by thread) and last completed step (by key). ``begin`` and
    ``end`` run on the training thread and only store references; the readers (the stall
    watch, the answer to rank 0, the exit) copy what they read."""

    def __init__(self, durations: bool = False) -> None:
        self.in_flight: Dict[int, Any] = {}  # thread ident -> StepHandle
        self.done: Dict[str, Any] = {}  # step key -> its last completed StepHandle
        self.last: Any = None  # the last completed StepHandle of any key
        self.durations: Optional[Dict[str, deque]] = {} if durations else None

    def begin(self, handle: StepHandle) -> None:
        handle.thread = threading.get_ident()
        self.in_flight[handle.thread] = handle

    def end(self, handle: StepHandle) -> None:
        self.in_flight.pop(handle.thread, None)
        done = self.done
        # what the readers need, not the handle (its records, op traces and deferred work)
        finished = _Done(handle.key, handle.step, handle.end_ns, handle.thread)
        if handle.key in done or len(done) < MAX_KEYS:
            done[handle.key] = finished
        self.last = finished
        durations = self.durations
        if durations is not None:
            kept = durations.get(handle.key)
            if kept is None:
                if len(durations) >= MAX_KEYS:
                    return
                kept = durations.setdefault(handle.key, deque(maxlen=DURATIONS_KEPT))
            kept.append(handle.end_ns - handle.start_ns)

    def flights(self) -> List[Any]:
        """The steps in flight now, oldest first."""
        for _ in range(3):
            try:
                return sorted(self.in_flight.values(), key=lambda h: h.start_ns)
            except RuntimeError:  # changed while copied (another stepping thread): again
                continue
        return []

    def oldest(self) -> Any:
        flights = self.flights()
        return flights[0] if flights else None

    def recent(self, key: str) -> List[int]:
        kept = (self.durations or {}).get(key)
        return list(kept) if kept is not None else []


def stack_of(thread: Optional[int]) -> List[List[Any]]:
    """A thread's Python stack, innermost first: [function, file, line] per frame, never a
    value or a local (bounded: messages.MAX_STACK_FRAMES)."""
    if thread is None:
        thread = threading.main_thread().ident or 0
    frame = sys._current_frames().get(thread)  # noqa: SLF001 - the one way to see another thread
    frames: List[List[Any]] = []
    limit = messages.MAX_FRAME_TEXT
    while frame is not None and len(frames) < messages.MAX_STACK_FRAMES:
        code = frame.f_code
        frames.append([code.co_name[:limit], code.co_filename[-limit:], frame.f_lineno or 0])
        frame = frame.f_back
    del frame
    return frames


def where(
    tracker: StepTracker,
    query: int,
    key: str,
    collectives: Optional[StepCollectives] = None,
    with_stack: bool = True,
) -> messages.Message:
    """This rank's answer to rank 0's question about a step of ``key`` (a
    ``messages.StallWhere``), with the collectives its step in flight holds where known; a
    probe's answer (``with_stack`` False) leaves the stack out."""
    now = clock.now_ns()
    flight = tracker.oldest()
    done = tracker.done.get(key) or tracker.last
    thread = flight.thread if flight is not None else None if done is None else done.thread
    answer: messages.Message = {
        "t": messages.STALL_WHERE,
        "q": query,
        "f": None if flight is None else [flight.key, flight.step, max(0, now - flight.start_ns)],
        "d": None if done is None else [done.key, done.step, max(0, now - done.end_ns)],
        "n": "" if flight is None else flight.name[: messages.MAX_KEY_LEN],
        "s": stack_of(thread) if with_stack else [],
    }
    if collectives is not None:
        total, names = collectives.built(key if flight is None else flight.key)
        answer["c"] = [total, names]
        answer["l"] = collectives.last_done()
    return answer


def _step_ahead(
    tracker: StepTracker, answers: Dict[int, messages.Message]
) -> Optional[Tuple[str, int, int]]:
    """The step another rank is in that rank 0 has not begun: (key, step, ns the longest
    of them has been in it), or None."""
    ahead: Optional[Tuple[str, int, int]] = None
    for rank, answer in answers.items():
        flight = answer.get("f")
        if rank == 0 or not flight:
            continue
        key, step, age = flight
        done = tracker.done.get(key)
        if done is not None and done.step >= step:
            continue  # rank 0 finished that step: the rank itself is behind (its own stall)
        if ahead is None or (key, step) == ahead[:2] and age > ahead[2]:
            ahead = (key, step, age)
    return ahead


# -- every rank: the answer --------------------------------------------------------------------


def register(pipeline: Any) -> None:
    """Answer rank 0's question on this rank (the coordinator reader thread, never the training
    thread): the answer first, then this rank's step in flight as a span, flushed."""

    def on_ask(message: messages.Message) -> None:
        report = bool(message.get("x", 1))  # else a probe: where, no stack, nothing exported
        tracker = pipeline.tracker
        answer = where(tracker, message["q"], message["k"], pipeline.collectives, report)
        pipeline.send_to_reference(answer)
        count("stall_answers")
        if report and pipeline.export_in_flight(reason="stall"):
            flush_soon(pipeline.tracer_provider)

    pipeline.handlers.on_rank(messages.STALL_ASK, on_ask)


_flushing = threading.Lock()


def flush_soon(tracer_provider: Any = None, timeout_s: float = 3.0) -> None:
    """Hand what was just exported to the exporters now (spans and log records), on a daemon
    thread; one at a time (an exporter that hangs never piles up threads)."""
    if not _flushing.acquire(blocking=False):
        return

    def flush() -> None:
        try:
            from opentelemetry import trace

            provider = tracer_provider or trace.get_tracer_provider()
            with fail_open("stall.flush"):
                if hasattr(provider, "force_flush"):
                    provider.force_flush(int(timeout_s * 1000))
            with fail_open("stall.flush_logs"):
                from opentelemetry._logs import get_logger_provider

                logs = get_logger_provider()
                if hasattr(logs, "force_flush"):
                    logs.force_flush(int(timeout_s * 1000))
        finally:
            _flushing.release()

    threading.Thread(target=flush, name="tf_otel-stall-flush", daemon=True).start()


# -- rank 0: the watch -------------------------------------------------------------------------


@dataclass
class _Stall:
    """Rank 0's step that stalls: the handle, its threshold, the reports made so far. Between:
    a step the other ranks are in that rank 0 has not begun (``handle`` stands for it; rank 0's
    last completed step was ``after``)."""

    handle: StepHandle
    threshold_ns: int
    reports: int = 0
    after: Any = None  # between steps: rank 0's last completed step (a _Done) when it began


@dataclass
class _Idle:
    """Rank 0 between steps: its last completed step and when the next probe is due."""

    after: Any
    due_ns: int


class StallWatch:
    """Rank 0's watch thread: checks its step in flight every ``interval_s``."""

    def __init__(
        self,
        pipeline: Any,
        policy: Policy,
        interval_s: float = CHECK_INTERVAL_S,
        answer_wait_s: float = ANSWER_WAIT_S,
    ) -> None:
        self.pipeline = pipeline
        self.policy = policy
        self.interval_s = interval_s
        self.answer_wait_s = answer_wait_s
        self._stall: Optional[_Stall] = None
        self._idle: Optional[_Idle] = None
        self._traced: Any = None  # the step in flight in which rank 0 was seen tracing
        self._queries = itertools.count(1)
        self._query = 0
        self._answers: Dict[int, messages.Message] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tf_otel-stall", daemon=True)
        pipeline.handlers.on_reference(messages.STALL_WHERE, self._on_where)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with fail_open("stall.check"):
                self.check()

    def _on_where(self, rank: int, message: messages.Message) -> None:
        with self._cond:
            if message["q"] == self._query:
                self._answers[rank] = message
                self._cond.notify_all()
            else:
                count("stall_answers_late")

    def check(self) -> None:
        tracker = self.pipeline.tracker
        handle = tracker.oldest()
        stall = self._stall
        between = stall is not None and stall.after is not None
        if stall is not None and stall.handle is not handle:
            if not (between and handle is None and tracker.last is stall.after):
                self._stall = None
                if stall.reports:
                    self._resolve(stall)
        if handle is None:
            self._check_between(tracker)
            return
        self._idle = None
        age = clock.now_ns() - handle.start_ns
        stall = self._stall
        if stall is None:
            threshold = self.policy.threshold_ns(tracker.recent(handle.key))
            # rank 0 itself traced in this step (seen from half the threshold on): it compiles,
            # and goes on compiling in C++ after the trace (grappler, XLA), not waiting
            if self._traced is not handle and age >= threshold // 2:
                if is_tracing(stack_of(handle.thread)):
                    self._traced = handle
            if self._traced is handle:
                threshold = max(threshold, self.policy.floor_ns * WARMUP_FLOOR_FACTOR)
            if age < threshold:
                return
            stall = self._stall = _Stall(handle, threshold)
        if age >= report_due_ns(stall.threshold_ns, stall.reports + 1):
            stall.reports += 1
            self._report(stall)

    def _check_between(self, tracker: StepTracker) -> None:
        """Rank 0 outside any step: once a threshold (of its last step's key) passes, it probes
        whether the other ranks are in a step it has not begun (a probe's answers carry no
        stack: one small message a rank a threshold); if so, that step stalls on rank 0,
        reported as any stall (rank 0 named as missing)."""
        last = tracker.last
        stall = self._stall
        if stall is not None:  # a step stalled on rank 0 between steps: its back-off
            age = clock.now_ns() - stall.handle.start_ns
            if age >= report_due_ns(stall.threshold_ns, stall.reports + 1):
                stall.reports += 1
                self._report(stall)
            return
        if last is None:
            return
        threshold = self.policy.threshold_ns(tracker.recent(last.key))
        idle = self._idle
        if idle is None or idle.after is not last:
            idle = self._idle = _Idle(last, last.end_ns + threshold)
        if clock.now_ns() < idle.due_ns:
            return
        count("stall_probes")
        answers, _ = self._ask(last.key, last.step + 1, export=False)
        ahead = _step_ahead(tracker, answers)
        now = clock.now_ns()
        if ahead is None:  # every rank between steps too (evaluation, a checkpoint, the end)
            idle.due_ns = now + threshold
            return
        key, step, age_ns = ahead
        if age_ns < threshold:  # they only just began it (rank 0 may be a moment behind)
            idle.due_ns = now + threshold - age_ns
            return
        standin = StepHandle(
            key=key,
            step=step,
            name=key,
            kind="",
            trace_id=step_trace_id(self.pipeline.trace_scope, key, step),
            sampled=True,
            start_ns=now - age_ns,
        )
        self._stall = _Stall(standin, threshold, after=last)
        self._stall.reports = 1
        self._report(self._stall)

    def _ask(
        self, key: str, step: int, export: bool = True
    ) -> Tuple[Dict[int, messages.Message], Set[int]]:
        """Ask every connected rank where it is; their answers within answer_wait_s."""
        with self._cond:
            self._query = query = next(self._queries)
            self._answers = {}
        connected = self.pipeline.connected_ranks()
        self.pipeline.broadcast(messages.stall_ask(query, key, step, export))
        deadline = time.monotonic() + self.answer_wait_s
        with self._cond:
            while not connected <= set(self._answers):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            answers = dict(self._answers)
            self._query = 0
        answers[0] = where(self.pipeline.tracker, query, key, self.pipeline.collectives, export)
        return answers, connected

    def _report(self, stall: _Stall) -> None:
        handle = stall.handle
        self.pipeline.export_in_flight(reason="stall")
        answers, connected = self._ask(handle.key, handle.step)
        now = clock.now_ns()
        history = self.pipeline.exporter.world  # a world that changed (Horovod Elastic)
        built = build_record(
            handle.key,
            handle.step,
            self.pipeline.topology.step_world_size,  # ranks that run steps (not a ps)
            now - handle.start_ns,
            stall.threshold_ns,
            stall.reports,
            answers,
            connected,
            self.answer_wait_s,
            rank0_in_step=stall.after is None,
            ranks=history.ranks_of(handle.key, handle.step) if history is not None else None,
        )
        count("stalls_reported")
        if stall.reports == 1:
            count("stalls_begun")
        self._export(handle, built, handle.start_ns, now)

    def _resolve(self, stall: _Stall) -> None:
        handle = stall.handle
        end = handle.end_ns or clock.now_ns()
        built = resolved_record(
            handle.key,
            handle.step,
            end - handle.start_ns,
            stall.threshold_ns,
            stall.reports,
            handle.error,
            rank0_in_step=stall.after is None,
        )
        count("stalls_resolved")
        self._export(handle, built, handle.start_ns, end)

    def _export(self, handle: StepHandle, built: StallRecord, start_ns: int, end_ns: int) -> None:
        context = None
        with fail_open("stall.span"):
            context = self.pipeline.export_in_step(
                handle, f"stall {handle.key} step {handle.step}", start_ns, end_ns, built.attributes
            )
        with fail_open("stall.log"):
            _log(built, context)
        flush_soon(self.pipeline.tracer_provider)


_LOG_ATTRIBUTES = (
    record.ATTR_STEP,
    record.ATTR_STEP_KEY,
    record.ATTR_STALL_STATE,
    record.ATTR_STALL_DURATION,
    record.ATTR_STALL_THRESHOLD,
    record.ATTR_STALL_REPORT,
    record.ATTR_STALL_MISSING,
    record.ATTR_STALL_WAITING,
    record.ATTR_STALL_SILENT,
)


def _log(built: StallRecord, span_context: Any) -> None:
    """One WARNING of logger tf_otel, in the stall span's trace, with the record's main
    attributes."""
    extra = {name: built.attributes[name] for name in _LOG_ATTRIBUTES if name in built.attributes}
    log_in_trace(logging.WARNING, built.summary, extra, span_context)


def start_watch(pipeline: Any) -> Optional[StallWatch]:
    """Rank 0 of a job of several ranks: the watch thread (None elsewhere or when off)."""
    settings = pipeline.settings
    if not settings.stall or pipeline.topology.step_world_size < 2:
        return None
    watch = StallWatch(pipeline, Policy(settings.stall_floor_s, settings.stall_factor))
    watch.start()
    return watch
