"""Detail-step twins (tf_otel/instrument/detail_twin.py) in one process, real TensorFlow, no
Horovod: which trace runs on which step, nested functions, a twin that cannot be traced, and the
twin's preparation off the training thread (issue 45): traced and instantiated on the twin
thread, never run there, and picked steps gated until it is ready."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from tf_otel.instrument import cpu_pacer, detail_twin

tf = pytest.importorskip("tensorflow")


def traced_flags():
    """A tf.function recording, per trace, whether it was traced inside a twin."""
    seen = []
    threads = []

    @tf.function
    def inner(x):
        seen.append(("inner", detail_twin.tracing()))
        return x * 2

    @tf.function
    def step(x):
        seen.append(("step", detail_twin.tracing()))
        threads.append((detail_twin.tracing(), threading.current_thread().name))
        return inner(x) + 1

    step.threads = threads

    return step, inner, seen


def call(function, x):
    return function(x)  # through tf_otel's tf.function wrapper (instrument/function.py)


@pytest.fixture
def source():
    from opentelemetry.instrumentation.utils import unwrap
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    from tf_otel.instrument import function

    function._patch(polymorphic_function)
    wanted = [True]

    def want() -> bool:
        return wanted[0]

    detail_twin.wanted_by(want)
    yield wanted
    wanted[0] = False
    detail_twin.want(False)
    unwrap(polymorphic_function.Function, "__call__")


def test_steps_without_detail_run_the_program_trace_and_the_twin_is_prepared_beside_it(source):
    step, inner, seen = traced_flags()
    x = tf.constant(1.0)
    assert float(call(step, x)) == 3.0  # first call: the program's trace; the twin's queued
    assert detail_twin.wait_open(120), detail_twin.generations()
    assert ("step", False) in seen and ("step", True) in seen
    main = threading.current_thread().name
    assert (False, main) in step.threads, "the program's trace on the training thread"
    assert (True, detail_twin.THREAD_NAME) in step.threads, "the twin traced on the twin thread"
    assert all(name != main for inside, name in step.threads if inside), step.threads
    traces = len(seen)
    detail_twin.want(True)
    assert float(call(step, x)) == 3.0  # a detail step: the twin, already traced
    detail_twin.want(False)
    assert float(call(step, x)) == 3.0
    assert len(seen) == traces, "no trace on the detail step or after it"
    assert step.experimental_get_tracing_count() == 1
    assert step._tf_otel_twin.experimental_get_tracing_count() == 1


def test_preparing_a_twin_instantiates_it_without_running_it(source):
    from tf_otel import health

    runs = tf.Variable(0)

    @tf.function
    def counted(x):
        runs.assign_add(1)  # a side effect: what a step's collectives and updates are
        return x + 1

    before = health.counters.get("twin_instantiated", 0)
    x = tf.constant(1.0)
    assert float(call(counted, x)) == 2.0
    assert detail_twin.wait_open(120), detail_twin.generations()
    assert health.counters.get("twin_instantiated", 0) == before + 1
    assert health.counters.get("twin_instantiate_ran", 0) == 0
    assert int(runs.numpy()) == 1, "the preparation never runs the twin"
    assert detail_twin.THREAD_NAME in detail_twin.prepared_on()
    from tf_otel.instrument import cpu_pacer

    assert cpu_pacer.LOW_PRIORITY.niced, "instantiated on the nice-19 thread"
    detail_twin.want(True)
    assert float(call(counted, x)) == 2.0  # the detail step: the prepared twin, run once
    detail_twin.want(False)
    assert int(runs.numpy()) == 2
    assert counted._tf_otel_twin.experimental_get_tracing_count() == 1


def _detail_call(function, x, key, step):
    """A picked step ``step`` of ``key``: did it run the program's own function?"""
    assert detail_twin.ready_for(key, step) or detail_twin.generations()[2] == 0
    detail_twin.want(True)
    try:
        call(function, x)
        return detail_twin.ran_own_function()
    finally:
        detail_twin.want(False)


def _reported(opened, generation):
    deadline = time.monotonic() + 120
    while not any(generation in g for g in opened) and time.monotonic() < deadline:
        time.sleep(0.05)
    return any(generation in g for g in opened)


def test_a_picked_step_runs_the_twin_of_its_trace_once_that_is_open(source, monkeypatch):
    from tf_otel import health

    opened = []
    monkeypatch.setattr(detail_twin._gate, "reporters", [opened.append])  # rank 0 answers, not here
    queued, prepared, _ = detail_twin.generations()

    @tf.function
    def fresh(x):
        return x * 3

    x = tf.constant(1.0)
    call(fresh, x)  # a new trace: a new generation
    assert detail_twin.generations()[0] == queued + 1
    assert _reported(opened, queued + 1), "the twin thread reports the prepared generation"
    key = "tf_function:fresh"
    assert _detail_call(fresh, x, key, 10), "prepared here is not open everywhere: its own"
    detail_twin.open([queued + 1], {key: 12})  # rank 0: from step 12 of this key
    assert _detail_call(fresh, x, key, 11), "open from step 12"
    on_step = health.counters.get("twin_traced_on_step", 0)
    assert not _detail_call(fresh, x, key, 12), "open: the twin"
    assert not _detail_call(fresh, x, key, 40)
    assert health.counters.get("twin_traced_on_step", 0) == on_step
    assert fresh._tf_otel_twin.experimental_get_tracing_count() == 1
    detail_twin.ready_for("keras_train", 0)
    assert detail_twin.is_open(queued + 1), "a key rank 0 had not stepped: at once"


def test_a_detail_step_with_arguments_never_traced_runs_its_own_and_queues_the_twin(source):
    """A last partial batch: its twin is not traced on its step (the program traces its own
    function there anyway); it is prepared beside it for the next such step."""
    from tf_otel import health

    @tf.function(reduce_retracing=False)
    def batch_sum(x):
        return tf.reduce_sum(x) * 2

    call(batch_sum, tf.ones([4]))
    assert detail_twin.wait_open(120), detail_twin.generations()
    key = "tf_function:batch_sum"
    assert not _detail_call(batch_sum, tf.ones([4]), key, 5), "a prepared trace: the twin"
    queued = detail_twin.generations()[0]
    on_step = health.counters.get("twin_traced_on_step", 0)
    assert _detail_call(batch_sum, tf.ones([3]), key, 6), "a new shape: the program's own"
    assert health.counters.get("twin_traced_on_step", 0) == on_step, "no twin traced on it"
    assert batch_sum.experimental_get_tracing_count() == 2
    assert detail_twin.generations()[0] == queued + 1, "its twin queued"
    assert detail_twin.wait_open(120), detail_twin.generations()
    assert not _detail_call(batch_sum, tf.ones([3]), key, 7), "prepared since: the twin"
    assert health.counters.get("twin_traced_on_step", 0) == on_step


def test_a_newer_trace_of_the_function_is_prepared_first(source):
    """Horovod's synthetic benchmark: the first step traces ``first_batch=True`` (called once),
    the next the steady trace. The steady twin is prepared first: the first trace's, under way
    on the twin thread when the steady one is queued, gives way and is prepared after it."""
    from tf_otel import health

    order = []
    steady, under_way = threading.Event(), threading.Event()

    @tf.function
    def bench_step(x, first_batch):
        if detail_twin.tracing():
            if first_batch:
                under_way.set()
                while not steady.is_set():  # a slow trace, until the steady one is traced
                    sum(abs(i) for i in range(100))
            else:
                steady.set()
            order.append(first_batch)
        return x * 2

    superseded = health.counters.get("twin_superseded", 0)
    x = tf.constant(1.0)
    call_first = bench_step(x, True)  # through tf_otel's wrapper: the first trace, queued
    # until its twin's trace is under way on the twin thread (a tracing count says so only
    # once a trace has finished)
    assert under_way.wait(60)
    time.sleep(0.3)
    bench_step(x, False)  # the steady trace, queued: the first gives way
    assert float(call_first) == 2.0
    assert detail_twin.wait_open(120), detail_twin.generations()
    assert order == [False, True], order
    assert health.counters.get("twin_superseded", 0) == superseded + 1


class _AtAnyEvent(cpu_pacer.Pacer):
    """The control: raises at whatever profile event comes once stop() says so."""

    def __call__(self, frame, event, arg):
        if self.stop():
            raise cpu_pacer.Abandoned()


def _abandon_traces(rule: str) -> Counter:
    """On a thread of its own (what a leaked graph context does to a thread dies with it):
    trace a small tf.function again and again, the pacer stopping at every 200th of the trace's
    profile events; after each, whether the thread's TensorFlow is as it was: tf_stack's
    per-thread stacks balanced, eager execution back."""
    import itertools
    import sys

    from tensorflow.python.util import tf_stack

    def make():
        @tf.function
        def f(x):
            return tf.reduce_sum(tf.nn.relu(x * 2.0)) + 1.0

        return f

    spec = tf.TensorSpec([4])
    outcomes: Counter = Counter()

    def run() -> None:
        ident = threading.get_ident()
        make().get_concrete_function(spec)  # first trace of its kind: caches warmed
        events = [0]

        def counter(frame, event, arg):
            events[0] += 1

        sys.setprofile(counter)
        make().get_concrete_function(spec)
        sys.setprofile(None)
        for stop_at in range(0, events[0], max(1, events[0] // 200)):
            checks = itertools.count()
            pacer = paced(stop=lambda checks=checks, at=stop_at: next(checks) >= at)
            pacer.look = lambda wall, cpu: 0.0  # not paced: only where it stops matters
            function = make()
            sys.setprofile(pacer)
            try:
                function.get_concrete_function(spec)
                out = "finished"
            except BaseException as exc:  # noqa: BLE001 - what came out is the point
                out = "Abandoned" if isinstance(exc, cpu_pacer.Abandoned) else "other"
            finally:
                sys.setprofile(None)
            whole = (
                len(tf_stack._source_mapper_stacks[ident]) == 1
                and len(tf_stack._source_filter_stacks[ident]) == 1
                and tf.executing_eagerly()
            )
            outcomes[(out, whole)] += 1

    paced = cpu_pacer.Pacer if rule == "safe calls" else _AtAnyEvent
    saved = cpu_pacer._EVERY
    try:
        cpu_pacer._EVERY = 0  # look (and stop) at every event: each position can be hit
        thread = threading.Thread(target=run)
        thread.start()
        thread.join(300)
    finally:
        cpu_pacer._EVERY = saved
    return outcomes


# the control's broken generators are closed by the collector, which reports what they raise
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_twin_trace_abandoned_anywhere_leaves_the_thread_s_tensorflow_whole():
    """A superseded or exiting twin trace is abandoned at the next plain Python call outside any
    context manager: at each of ~200 positions through a real trace it ends with Abandoned (or
    a finished trace, past its last call) and TensorFlow on that thread is whole after.
    Control: raising at whatever profile event comes (a C call's return inside tf_stack's
    __enter__, a context manager's __exit__ starting) leaves the thread's TensorFlow broken at
    some positions (a tf_stack unbalanced: "Concurrent access?"), so the check can fail."""
    outcomes = _abandon_traces("safe calls")
    assert sum(outcomes.values()) >= 150, outcomes
    assert all(whole for (_, whole) in outcomes), outcomes
    assert outcomes[("Abandoned", True)] >= 150, outcomes
    control = _abandon_traces("any event")
    assert any(not whole for (_, whole) in control), control


def test_functions_nested_in_a_twin_get_twins_of_their_own(source):
    step, inner, seen = traced_flags()
    call(step, tf.constant(2.0))  # the program's own trace: its inner traced plainly
    assert seen[:2] == [("step", False), ("inner", False)]
    assert detail_twin.wait_open(120)
    assert ("inner", True) in seen, "the twin's trace swapped inner for its own twin"
    assert getattr(inner, "_tf_otel_twin", None) is not None
    traces = len(seen)
    detail_twin.want(True)
    assert float(call(step, tf.constant(2.0))) == 5.0
    detail_twin.want(False)
    assert len(seen) == traces


def test_a_detail_step_on_the_first_call_runs_the_program_function_and_says_so(source):
    """A picked step that is its function's first call: tracing the twin there would make the
    step pay for a second trace (the program's own would then fall on a later step)."""
    from tf_otel import health

    step, _, seen = traced_flags()
    on_step = health.counters.get("twin_traced_on_step", 0)
    detail_twin.want(True)
    assert float(call(step, tf.constant(2.0))) == 5.0
    assert detail_twin.ran_own_function(), "the step says it ran the program's function"
    detail_twin.want(False)
    assert not detail_twin.ran_own_function()
    assert seen[:2] == [("step", False), ("inner", False)], "the program's trace, not the twin's"
    assert health.counters.get("twin_traced_on_step", 0) == on_step
    assert detail_twin.wait_open(120)
    assert ("step", True) in seen, "the twin prepared beside it"
    assert all(name != threading.current_thread().name for inside, name in step.threads if inside)
    detail_twin.want(True)  # the next detail step runs the prepared twin
    assert float(call(step, tf.constant(2.0))) == 5.0
    assert not detail_twin.ran_own_function()
    detail_twin.want(False)


def test_with_every_step_detailed_a_first_call_traces_the_twin_on_its_step(source):
    """TF_OTEL_HOROVOD_EVERY=1: the program's own function may never run, so the first call
    traces only the twin (one trace, as untraced), and every step is detailed from the first."""
    step, _, seen = traced_flags()
    detail_twin.want(True, every_step=True)
    assert float(call(step, tf.constant(2.0))) == 5.0
    assert not detail_twin.ran_own_function()
    detail_twin.want(False)
    assert seen == [("step", True), ("inner", True)], "the twin's trace only"
    assert step.experimental_get_tracing_count() == 0


def test_nothing_wanted_no_twin(source):
    source[0] = False
    step, _, seen = traced_flags()
    call(step, tf.constant(1.0))
    assert all(not inside for _, inside in seen)
    assert getattr(step, "_tf_otel_twin", None) is None


def test_a_twin_that_cannot_be_traced_is_given_up_and_the_step_still_runs(source):
    traces = []

    @tf.function
    def traces_once(x):
        traces.append(detail_twin.tracing())
        if len(traces) > 1:  # e.g. a program whose Python refuses a second trace
            raise RuntimeError("traced twice")
        return x + 1

    x = tf.constant(1.0)
    assert float(call(traces_once, x)) == 2.0  # its twin's trace fails beside it: given up
    assert detail_twin.wait_open(120)
    assert traces_once._tf_otel_twin is False
    detail_twin.want(True)
    assert float(call(traces_once, x)) == 2.0  # a detail step runs the program's own
    detail_twin.want(False)
    assert traces == [False, True]


_EXITS_WHILE_PREPARING = """
import sys, time
import tensorflow as tf
from tensorflow.python.eager.polymorphic_function import polymorphic_function
from tf_otel.instrument import detail_twin, function

function._patch(polymorphic_function)
detail_twin.wanted_by(lambda: True)
detail_twin.after_prepare(lambda: print("PREPARED", flush=True))

def tick():
    return 1


@tf.function
def step(x):
    if detail_twin.tracing():  # the twin's trace, on the twin thread: still under way at exit
        end = time.monotonic() + float(sys.argv[1])
        while time.monotonic() < end:  # a model's Python: plain calls (a C sleep is waited for)
            tick()
        print("TWIN TRACED", flush=True)
    return x + 1

# one write a line: print("A", b) writes "A", " ", b apart and the twin thread's own line can
# land between them
print(f"RESULT {float(step(tf.constant(1.0)))}", flush=True)
print(f"EXIT {time.monotonic()}", flush=True)
"""


@pytest.mark.parametrize("trace_s", [3.0, 0.0])
def test_a_program_exiting_while_a_twin_is_prepared_exits_cleanly(tmp_path, trace_s):
    """The program ends right after the step that traced its function, the twin's preparation
    under way on the twin thread. A trace still under way (3 s) is abandoned at the exit: the
    program does not wait for it, nothing is prepared. With a quick trace the exit may find the
    instantiation under way (TensorFlow's C++), which is let finish: a daemon thread left inside
    TensorFlow at finalisation can abort the process ('terminate called ... FATAL: exception
    not rethrown'). Either way it exits 0."""
    import subprocess
    import sys

    script = tmp_path / "exits.py"
    script.write_text(_EXITS_WHILE_PREPARING)
    done = subprocess.run(
        [sys.executable, str(script), str(trace_s)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "terminate called" not in done.stderr, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "RESULT 2.0" in lines, done.stdout
    assert any(line.startswith("EXIT") for line in lines), "the program's last line"
    if trace_s:  # the trace did not finish: abandoned, not waited for
        assert "TWIN TRACED" not in lines and "PREPARED" not in lines, done.stdout
