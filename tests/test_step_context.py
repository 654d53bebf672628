"""The step as the current OpenTelemetry context, in-process (no TensorFlow): a real SDK, a real
Pipeline, the real step wrapper (``_patching.run_step``). User spans made during and between
steps land in the right step trace under this rank's exported step span; spans made before the
first step do not; the user's own context comes back on release; log records carry the ids."""

from __future__ import annotations

import logging
import time
from typing import Any, List, Tuple

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

from tf_otel import clock, record
from tf_otel.config import Settings
from tf_otel.instrument import _patching
from tf_otel.instrument.step_context import ClockShiftProcessor, StepContextHook, StepSpan
from tf_otel.job.topology import Topology
from tf_otel.otel.ids import step_rank_span_id, step_trace_id
from tf_otel.runtime.steps import Pipeline

KEY = "tf_function:train_step"


class Run:
    """One pipeline + step-context hook on a real SDK provider (not the global one)."""

    def __init__(self, job: str, rank: int = 0, sampler: Any = None) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(sampler=sampler) if sampler else TracerProvider()
        self.provider.add_span_processor(ClockShiftProcessor())
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.pipeline = Pipeline(Settings(), Topology(job_id=job, rank=rank), self.provider)
        self.hook = StepContextHook(lambda: self.pipeline)
        self.tracer = self.provider.get_tracer("user")
        self.job, self.rank = job, rank

    def step(self, body: Any = None) -> Any:
        """One step the way instrument/ runs it: begin, hooks, the call, end."""
        handle = self.pipeline.begin_step(KEY, "tf.function train_step", record.TF_FUNCTION)
        self.hook.on_step_start(handle)
        try:
            return body() if body else time.sleep(0.001)
        finally:
            self.pipeline.end_step(handle)

    def finish(self) -> List[Any]:
        self.hook.release()
        self.pipeline.shutdown()
        return list(self.exporter.get_finished_spans())

    def step_span_id(self, step: int) -> int:
        return step_rank_span_id(self.job, KEY, step, self.rank)


@pytest.fixture(autouse=True)
def _clean_context():
    token = otel_context.attach(otel_context.Context())  # each test starts with no span
    yield
    otel_context.detach(token)


def _steps(spans) -> dict:
    return {
        s.attributes[record.ATTR_STEP]: s
        for s in spans
        if s.attributes.get(record.ATTR_CATEGORY) == record.STEP
    }


def test_spans_during_and_between_steps_land_in_that_step_under_the_rank_span() -> None:
    run = Run("ctx-1", rank=0)
    with run.tracer.start_as_current_span("before training"):
        pass
    made: List[Tuple[str, int]] = []  # (span name, the step it was made in)

    def during(n: int) -> Any:
        def body() -> None:
            with run.tracer.start_as_current_span(f"during {n}"):
                with run.tracer.start_as_current_span(f"inner {n}"):
                    time.sleep(0.0005)
            made.append((f"during {n}", n))

        return body

    for n in range(3):
        run.step(during(n))
        with run.tracer.start_as_current_span(f"between {n}"):  # e.g. a Keras callback
            pass
        made.append((f"between {n}", n))
    spans = run.finish()
    by_name = {s.name: s for s in spans}
    steps = _steps(spans)
    assert sorted(steps) == [0, 1, 2]
    for n, step_span in steps.items():
        # the exported step span has the id the context announced at step begin
        assert step_span.context.span_id == run.step_span_id(n)
        assert step_span.context.trace_id == step_trace_id("ctx-1", KEY, n)
    for name, n in made:
        span = by_name[name]
        assert span.context.trace_id == step_trace_id("ctx-1", KEY, n), name
        assert span.parent.span_id == run.step_span_id(n), name
        assert not span.parent.is_remote
    inner = by_name["inner 1"]
    assert inner.parent.span_id == by_name["during 1"].context.span_id
    # control: a span made before the first step is in no step trace
    before = by_name["before training"]
    step_traces = {s.context.trace_id for s in steps.values()}
    assert before.parent is None and before.context.trace_id not in step_traces


def test_a_users_context_comes_back_on_release_and_a_with_block_across_steps() -> None:
    run = Run("ctx-2")
    outer = run.tracer.start_span("user around training")
    token = otel_context.attach(trace.set_span_in_context(outer))
    try:
        run.step()
        assert type(trace.get_current_span()) is StepSpan
        with run.tracer.start_as_current_span("epoch"):  # left open across a step
            run.step(lambda: run.tracer.start_span("in step 1").end())
        # the with block closed: the context below it names the latest step (1), not step 0
        assert trace.get_current_span().get_span_context().span_id == run.step_span_id(1)
        run.hook.release()
        assert trace.get_current_span() is outer  # the user's own context is back
    finally:
        otel_context.detach(token)
        outer.end()
    spans = run.finish()
    by_name = {s.name: s for s in spans}
    assert by_name["in step 1"].parent.span_id == run.step_span_id(1)
    assert by_name["epoch"].parent.span_id == run.step_span_id(0)


def test_after_release_step_spans_are_transparent() -> None:
    run = Run("ctx-3")
    run.step()
    current = trace.get_current_span()
    run.hook.release()
    # a context someone copied before the release no longer points into step traces
    assert not current.get_span_context().is_valid
    run.step()  # a step after shutdown (the job goes on) leaves the context alone
    assert not trace.get_current_span().get_span_context().is_valid
    run.finish()


def test_unsampled_steps_carry_ids_but_record_no_user_span() -> None:
    run = Run("ctx-4", sampler=TraceIdRatioBased(0.0))
    seen = []

    def body() -> None:
        span = run.tracer.start_span("user")
        seen.append((span.is_recording(), trace.get_current_span().get_span_context()))
        span.end()

    run.step(body)
    spans = run.finish()
    recording, ctx = seen[0]
    assert not recording and not ctx.trace_flags.sampled
    assert ctx.trace_id == step_trace_id("ctx-4", KEY, 0)
    assert ctx.span_id == run.step_span_id(0)
    assert not spans


def test_log_records_carry_the_step_ids() -> None:
    from opentelemetry.instrumentation.logging import LoggingInstrumentor

    run = Run("ctx-5")
    records: List[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, rec: logging.LogRecord) -> None:
            records.append(rec)

    log = logging.getLogger("ctx-5")
    log.addHandler(Keep())
    log.setLevel(logging.INFO)
    instrumentor = LoggingInstrumentor()
    instrumentor.instrument(inject_trace_context=True, enable_log_auto_instrumentation=False)
    try:
        log.info("before")
        run.step(lambda: log.info("during"))
        log.info("between")
    finally:
        instrumentor.uninstrument()
    run.finish()
    ids = {r.getMessage(): (r.otelTraceID, r.otelSpanID, r.otelTraceSampled) for r in records}
    assert ids["before"] == ("0", "0", False)
    expected = (f"{step_trace_id('ctx-5', KEY, 0):032x}", f"{run.step_span_id(0):016x}", True)
    assert ids["during"] == expected and ids["between"] == expected


def test_children_are_moved_onto_the_reference_clock_with_their_step() -> None:
    """Ground truth: rank 1's clock is 40 ms behind the reference. The step span is corrected by
    the pipeline; a user span made in the step must move with it (inside it), while a span
    outside any step keeps its own clock (control)."""
    previous = clock.current_model()
    clock.set_model(clock.ClockModel(offset_ns=40_000_000, uncertainty_ns=20_000))
    try:
        run = Run("ctx-6", rank=1)
        outside = run.tracer.start_span("outside")
        outside.end()
        run.step(lambda: run.tracer.start_span("in step").end())
        spans = run.finish()
    finally:
        clock.set_model(previous)
    by_name = {s.name: s for s in spans}
    step = _steps(spans)[0]
    child = by_name["in step"]
    assert step.start_time <= child.start_time <= child.end_time <= step.end_time
    assert child.attributes[record.ATTR_CLOCK_OFFSET] == 40_000_000
    control = by_name["outside"]
    assert abs(control.start_time - time.time_ns()) < 30 * 10**9  # sanity: a real time
    assert control.start_time < step.start_time - 30_000_000  # not shifted by the 40 ms
    assert record.ATTR_CLOCK_OFFSET not in control.attributes


def test_steps_on_two_threads_each_have_their_own_context() -> None:
    import threading

    run = Run("ctx-7")
    got = {}

    def worker(name: str) -> None:
        for _ in range(2):
            run.step()
        got[name] = trace.get_current_span().get_span_context()

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.finish()
    # one key: the four steps are numbered 0..3 across the threads; each thread ends on its own
    assert got["a"].span_id != got["b"].span_id
    assert not trace.get_current_span().get_span_context().is_valid  # this thread untouched


def test_the_step_wrapper_makes_the_step_current(monkeypatch) -> None:
    """Through _patching.run_step and the hook list, as the Keras / tf.function wrappers do."""
    run = Run("ctx-8")
    monkeypatch.setattr(_patching, "_get_pipeline", lambda: run.pipeline)
    monkeypatch.setattr(_patching, "step_hooks", (run.hook,))
    monkeypatch.setattr(_patching, "_active", True)
    seen = []

    def train_step() -> None:
        seen.append(trace.get_current_span().get_span_context())

    for _ in range(2):
        _patching.run_step(train_step, (), {}, KEY, "tf.function train_step", record.TF_FUNCTION)
    with pytest.raises(ValueError):
        _patching.run_step(
            lambda: (_ for _ in ()).throw(ValueError("x")), (), {}, KEY, "n", record.TF_FUNCTION
        )
    # after a failing step the context still names it (no token left half-detached)
    assert trace.get_current_span().get_span_context().span_id == run.step_span_id(2)
    run.finish()
    assert [c.span_id for c in seen] == [run.step_span_id(0), run.step_span_id(1)]
