"""Detail-step twins (tf_otel/instrument/twin.py) in one process, real TensorFlow, no Horovod:
which trace runs on which step, nested functions, and a twin that cannot be traced."""

from __future__ import annotations

import pytest

from tf_otel.instrument import twin

tf = pytest.importorskip("tensorflow")


def traced_flags():
    """A tf.function recording, per trace, whether it was traced inside a twin."""
    seen = []

    @tf.function
    def inner(x):
        seen.append(("inner", twin.tracing()))
        return x * 2

    @tf.function
    def step(x):
        seen.append(("step", twin.tracing()))
        return inner(x) + 1

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

    twin.wanted_by(want)
    yield wanted
    wanted[0] = False
    twin.want(False)
    unwrap(polymorphic_function.Function, "__call__")


def test_steps_without_detail_run_the_program_trace_and_the_twin_is_traced_beside_it(source):
    step, inner, seen = traced_flags()
    x = tf.constant(1.0)
    assert float(call(step, x)) == 3.0  # first call: the program's trace, then the twin's
    assert ("step", False) in seen and ("step", True) in seen
    traces = len(seen)
    twin.want(True)
    assert float(call(step, x)) == 3.0  # a detail step: the twin, already traced
    twin.want(False)
    assert float(call(step, x)) == 3.0
    assert len(seen) == traces, "no trace on the detail step or after it"
    assert step.experimental_get_tracing_count() == 1
    assert step._tf_otel_twin.experimental_get_tracing_count() == 1


def test_functions_nested_in_a_twin_get_twins_of_their_own(source):
    step, inner, seen = traced_flags()
    twin.want(True)
    call(step, tf.constant(2.0))
    twin.want(False)
    assert ("inner", True) in seen and ("inner", False) not in seen
    assert getattr(inner, "_tf_otel_twin", None) is not None
    call(step, tf.constant(2.0))  # the program's own trace: its inner traced plainly
    assert ("inner", False) in seen


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
        traces.append(twin.tracing())
        if len(traces) > 1:  # e.g. a program whose Python refuses a second trace
            raise RuntimeError("traced twice")
        return x + 1

    x = tf.constant(1.0)
    assert float(call(traces_once, x)) == 2.0  # its twin's trace fails beside it: given up
    assert traces_once._tf_otel_twin is False
    twin.want(True)
    assert float(call(traces_once, x)) == 2.0  # a detail step runs the program's own
    twin.want(False)
    assert traces == [False, True]
