"""The step as the current OpenTelemetry context on the training thread.

From the first step on, the current span of each training thread is that rank's span in the
latest step trace: spans that user code, Keras callbacks or other OpenTelemetry instrumentations
create during step N, or between steps N and N+1, land in step N's trace under this rank's step
span, and log records carry its ids (opentelemetry-instrumentation-logging's ``otelTraceID`` /
``otelSpanID`` / ``otelTraceSampled``, and the OTLP log records' trace and span ids).

How: the first step of a thread attaches (``opentelemetry.context.attach``) one context whose
current span is a ``StepSpan``: a non-recording span whose ``SpanContext`` is computed from the
thread's latest step (trace id = the step trace id, span id = ``step_rank_span_id``, the very id
the exported step span gets, sampled flag = the step's sampling decision, not remote). Later
steps only point that span at their step handle: no attach / detach per step, and a user's
``with`` block that ends between steps falls back onto a context that still names the latest
step. A step that begins while another span is current (a user's span left open around steps)
attaches the step context on top of it again. On uninstrument / shutdown the step spans turn
transparent (they report the user's span that was current below them) and, on the thread that
calls it, the step context is detached, restoring the user's own context.

Clock: user spans are stamped with the local clock, the rank's step span with the reference
clock (clock correction). ``ClockShiftProcessor`` maps a span whose parent is a step span (and
its descendants) onto the reference clock the same way, at its start and end, so children stay
inside their step span, up to the change of the clock model between the child's end and the step
span's export (within ``tf_otel.clock.uncertainty_ns`` once the clock has settled).

Usage::

    from tf_otel.instrument import step_context
    step_context.register()      # by TensorFlowInstrumentor; step_context.release() at the end
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, List, Optional, Tuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
)

from tf_otel import clock, record
from tf_otel.config import Settings
from tf_otel.health import count, fail_open, log_once
from tf_otel.instrument._patching import HookOrder, StepCall, StepHook, add_step_hook
from tf_otel.otel.ids import step_rank_span_id
from tf_otel.runtime.lifecycle import before_shutdown, current_pipeline, given_tracer_provider
from tf_otel.runtime.steps import Pipeline
from tf_otel.step_handle import StepHandle

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSAMPLED = TraceFlags(TraceFlags.DEFAULT)
_KEEP_ATTACHED = 8


class ThreadSteps:
    """The latest step of one training thread, and the context tf_otel attached there."""

    __slots__ = ("handle", "active", "job_id", "rank", "_cached", "attached", "__weakref__")

    def __init__(self, job_id: str, rank: int) -> None:
        self.handle: Optional[StepHandle] = None
        self.active = True
        self.job_id = job_id
        self.rank = rank
        self._cached: Tuple[Any, SpanContext] = (None, INVALID_SPAN_CONTEXT)
        # (context, token) of each attach on this thread, newest last (few: one per fit() or
        # per user span left open across a step)
        self.attached: List[Tuple[Any, Any]] = []

    def span_context(self) -> SpanContext:
        """The rank's step span context of the latest step, computed once per step, on demand
        (a step in which nothing reads the context costs no hash)."""
        handle = self.handle
        cached = self._cached
        if cached[0] is handle:
            return cached[1]
        if handle is None:
            return INVALID_SPAN_CONTEXT
        span_context = SpanContext(
            trace_id=handle.trace_id,
            span_id=step_rank_span_id(self.job_id, handle.key, handle.step, self.rank),
            is_remote=False,
            trace_flags=_SAMPLED if handle.sampled else _UNSAMPLED,
        )
        self._cached = (handle, span_context)
        return span_context


class StepSpan(NonRecordingSpan):
    """The current span on a training thread: this rank's span in the thread's latest step."""

    def __init__(self, steps: ThreadSteps, below: Any) -> None:
        super().__init__(INVALID_SPAN_CONTEXT)
        self.steps = steps
        self.below = below  # the span that was current when this one was attached

    def get_span_context(self) -> SpanContext:
        if self.steps.active:
            return self.steps.span_context()
        return self.below.get_span_context()  # released: transparent

    def __repr__(self) -> str:
        return f"StepSpan({self.get_span_context()!r})"


def pinned_context() -> Optional[Any]:
    """On a training thread: a context naming the step that is current there now, and only
    that step (later steps do not move it); None outside a step context. For work tf_otel does
    for this step on another thread that runs the program's Python (the detail twin's trace):
    the spans and log records it makes land in this step's trace, under this rank's step span,
    on the reference clock (``ClockShiftProcessor``)."""
    span = trace.get_current_span()
    if type(span) is not StepSpan or not span.steps.active or span.steps.handle is None:
        return None
    pinned = ThreadSteps(span.steps.job_id, span.steps.rank)
    pinned.handle = span.steps.handle
    return trace.set_span_in_context(StepSpan(pinned, span.below))


class StepContextHook(StepHook[None]):
    """Makes each step the current context of the thread that runs it."""

    order = HookOrder.CONTEXT

    def __init__(self, pipeline_of: Callable[[], Optional[Pipeline]] = current_pipeline) -> None:
        self.pipeline_of = pipeline_of  # the pipeline whose steps these are (job id, rank)
        self.local = threading.local()
        self.all: weakref.WeakSet[ThreadSteps] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.released = False  # after shutdown, steps that still run leave the context alone

    def on_step_start(self, handle: StepHandle, call: Optional[StepCall] = None) -> None:
        if self.released:
            return
        steps: Optional[ThreadSteps] = getattr(self.local, "steps", None)
        if steps is None:
            pipeline = self.pipeline_of()
            if pipeline is None:
                return
            # the step ids hash the job id and the attempt (Topology.trace_scope)
            steps = ThreadSteps(pipeline.trace_scope, pipeline.topology.rank)
            self.local.steps = steps
            with self._lock:
                self.all.add(steps)
        steps.handle = handle
        steps.active = True
        current = otel_context.get_current()
        span = trace.get_current_span(current)
        if type(span) is StepSpan and span.steps is steps:
            return  # the usual case: the step context is still current, now naming this step
        attached = trace.set_span_in_context(StepSpan(steps, span), current)
        steps.attached.append((attached, otel_context.attach(attached)))
        del steps.attached[:-_KEEP_ATTACHED]
        count("step_context_attached")

    def release(self) -> None:
        """Steps stop being the current context: every thread's step spans turn transparent; on
        this thread the step context is detached if it is current (the user's comes back)."""
        self.released = True
        with self._lock:
            every = list(self.all)
        for steps in every:
            steps.active = False
        steps_here: Optional[ThreadSteps] = getattr(self.local, "steps", None)
        if steps_here is None:
            return
        ours = {id(ctx): (ctx, token) for ctx, token in steps_here.attached}
        steps_here.attached = []
        # only a step context that is current is detached: a user's context on top of it is
        # left alone (its own detach restores ours, transparent by now)
        while True:
            current = otel_context.get_current()
            entry = ours.pop(id(current), None)
            if entry is None or entry[0] is not current or not _detach(entry[1]):
                break


def _detach(token: Any) -> bool:
    """Detach without the SDK's error log: a token made in another contextvars Context (a copied
    context) cannot be reset there; then the transparent span stays."""
    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    try:
        if runtime is not None:
            runtime.detach(token)
        else:
            otel_context.detach(token)
        return True
    except Exception:  # noqa: BLE001
        count("step_context_detach_failed")
        return False


class ClockShiftProcessor:
    """SpanProcessor: spans whose parent is a step span (and their descendants) are moved onto
    the reference clock like the step span itself, so they stay inside it after correction.

    Uses the SDK's ``_on_ending`` hook (called with the still-writable span before the
    exporters' copy is taken); an SDK without it leaves the end unshifted (counted)."""

    # tf_otel's record spans (parent: a NonRecordingSpan) are never shifted: pipeline's
    # span_builder may hand them to the exporters without calling this processor
    ignores_tf_otel_records = True

    def __init__(self) -> None:
        self._shifted: weakref.WeakSet[Any] = weakref.WeakSet()

    def _delta(self) -> int:
        # tf_otel's local clock vs the SDK's (they differ only under TF_OTEL_TEST_CLOCK)
        import time

        return clock.now_ns() - time.time_ns()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        parent = trace.get_current_span(parent_context)
        if type(parent) is StepSpan:
            if not parent.steps.active:
                return
        elif parent not in self._shifted:
            return
        with fail_open("step_context.shift_start"):
            model = clock.current_model()
            local = span._start_time + self._delta()
            span._start_time = model.to_reference(local)
            span.set_attribute(record.ATTR_CLOCK_OFFSET, model.offset_at(local))
            span.set_attribute(record.ATTR_CLOCK_UNCERTAINTY, model.uncertainty_ns)
            self._shifted.add(span)

    def _on_ending(self, span: Any) -> None:
        if span not in self._shifted:
            return
        with fail_open("step_context.shift_end"):
            span._end_time = max(
                span._start_time, clock.current_model().to_reference(span._end_time + self._delta())
            )

    def on_end(self, span: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


_hook: Optional[StepContextHook] = None
_processor: Optional[ClockShiftProcessor] = None


def register(settings: Settings) -> None:
    """Make steps the current context (TensorFlowInstrumentor calls this)."""
    global _hook, _processor
    if _hook is None:
        _hook = StepContextHook()
    _hook.released = False
    add_step_hook(_hook)
    before_shutdown(release)
    if _processor is None:
        provider = given_tracer_provider() or trace.get_tracer_provider()
        if hasattr(provider, "add_span_processor"):
            _processor = ClockShiftProcessor()
            provider.add_span_processor(_processor)
        else:
            log_once(
                "step_context_clock",
                "tf_otel: the TracerProvider is not the SDK's; spans made during steps keep the "
                "local clock",
            )


def release() -> None:
    """Steps stop being the current context (uninstrument, shutdown)."""
    if _hook is not None:
        with fail_open("step_context.release"):
            _hook.release()
