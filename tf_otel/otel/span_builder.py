"""Finished child spans handed straight to the SDK's span processors, for the many spans of a
detail step (a real model: ~160 collectives, each with up to two children).

``Tracer.start_span`` + ``end`` cost ~2/3 of a collective span's CPU before export (cProfile,
bench/bench_detail_cpu.py): a context object, the sampler, attribute cleaning in
``BoundedAttributes``, on_start/on_end of every processor. Our records are finished when they
are emitted, their attribute values are plain str/int/float/bool, and under a sampled parent the
SDK's default samplers always record and sample, so the result is known in advance: a
``ReadableSpan`` with the parent's trace id, trace state and random-trace-id flag, a fresh span
id from the tracer's generator, the tracer's resource and scope.

The direct path is taken only when that equivalence holds: the SDK tracer, enabled, a
ParentBased sampler whose sampled-parent delegates are ALWAYS_ON (the default) or ALWAYS_ON
itself, only the SDK's batch / simple processors or processors with neither an ``on_start`` nor
an ``_on_ending`` of their own (nothing of a user processor is skipped; on_end sees every direct
span), no
attribute-count or value-length limit a span could reach, and only plain attribute values.
A processor of tf_otel's own that does nothing with these spans says so with a class attribute
``ignores_tf_otel_records = True`` (instrument/step_context's ClockShiftProcessor: it shifts
only spans under a StepSpan).
Anything else goes through ``Tracer.start_span``. Not counted by the SDK's own
span-count self-metrics.

Usage::

    builder = SpanBuilder(tracer)
    ctx = builder.finished(name, parent_ctx, start_ns, end_ns, attributes)  # -> SpanContext
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from tf_otel.health import count

_PLAIN = frozenset((str, bool, int, float))


def _plain(attributes: Dict[str, Any]) -> bool:
    for value in attributes.values():
        if type(value) not in _PLAIN:
            return False
    return True


def _only_on_end(processor: Any, base: Any) -> bool:
    """The processor keeps the base class's no-op ``on_start`` and ``_on_ending`` (the SDK calls
    that one as a span ends; step_context's clock shift uses it): handing it finished spans
    skips nothing, its ``on_end`` sees every direct span."""
    kind = type(processor)
    hooks = ("on_start", "_on_ending")
    return all(getattr(kind, hook, None) is getattr(base, hook, None) for hook in hooks)


class SpanBuilder:
    """Emits finished INTERNAL spans under a known parent span context."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        self._direct: Optional[bool] = None  # decided at first use: processors may come later
        self._max_attributes: Optional[int] = None
        self._classes: Any = None  # (ReadableSpan, SpanContext, TraceFlags, random bit)

    def _eligible(self) -> bool:
        try:
            from opentelemetry.sdk.trace import (
                ReadableSpan,
                SpanProcessor,
                SynchronousMultiSpanProcessor,
            )
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
            from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
        except ImportError:
            return False
        from opentelemetry.trace import SpanContext, TraceFlags

        # looked up once: an import statement per span showed in the profile
        random_bit = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)  # W3C level 2, newer APIs
        self._classes = (ReadableSpan, SpanContext, TraceFlags, random_bit)
        tracer = self._tracer
        sampler = getattr(tracer, "sampler", None)
        if isinstance(sampler, ParentBased):
            if not (
                sampler._remote_parent_sampled is ALWAYS_ON
                and sampler._local_parent_sampled is ALWAYS_ON
            ):
                return False
        elif sampler is not ALWAYS_ON:
            return False
        multi = getattr(tracer, "span_processor", None)
        if not isinstance(multi, SynchronousMultiSpanProcessor):
            return False
        if not all(
            isinstance(p, (BatchSpanProcessor, SimpleSpanProcessor))
            or getattr(p, "ignores_tf_otel_records", False)  # e.g. step_context's clock shift
            or _only_on_end(p, SpanProcessor)  # delivery's end counter
            for p in multi._span_processors
        ):
            return False
        limits = getattr(tracer, "_span_limits", None)
        if limits is None or limits.max_span_attribute_length is not None:
            return False
        self._max_attributes = limits.max_span_attributes
        return bool(getattr(tracer, "_is_enabled", lambda: False)())

    def finished(
        self, name: str, parent: Any, start_ns: int, end_ns: int, attributes: Dict[str, Any]
    ) -> Any:
        """Emit one finished span under ``parent`` (a sampled SpanContext); its SpanContext."""
        if self._direct is None:
            self._direct = self._eligible()
            if not self._direct:  # said in the exit counters: detail spans cost ~3x more
                count("spans_via_sdk_start_span")
        if (
            self._direct
            and parent.trace_flags.sampled
            and (self._max_attributes is None or len(attributes) <= self._max_attributes)
            and _plain(attributes)
        ):
            return self._emit_direct(name, parent, start_ns, end_ns, attributes)
        return self._emit_sdk(name, parent, start_ns, end_ns, attributes)

    def _emit_direct(
        self, name: str, parent: Any, start_ns: int, end_ns: int, attributes: Dict[str, Any]
    ) -> Any:
        readable_span, span_context, trace_flags, random_bit = self._classes
        tracer = self._tracer
        context = span_context(
            parent.trace_id,
            tracer.id_generator.generate_span_id(),
            is_remote=False,
            trace_flags=trace_flags(trace_flags.SAMPLED | (parent.trace_flags & random_bit)),
            trace_state=parent.trace_state,
        )
        span = readable_span(
            name,
            context=context,
            parent=parent,
            resource=tracer.resource,
            attributes=attributes,
            instrumentation_info=tracer.instrumentation_info,
            start_time=start_ns,
            end_time=end_ns,
            instrumentation_scope=tracer._instrumentation_scope,
        )
        tracer.span_processor.on_end(span)
        return context

    def _emit_sdk(
        self, name: str, parent: Any, start_ns: int, end_ns: int, attributes: Dict[str, Any]
    ) -> Any:
        from opentelemetry.trace import NonRecordingSpan, set_span_in_context

        span = self._tracer.start_span(
            name,
            context=set_span_in_context(NonRecordingSpan(parent)),
            start_time=start_ns,
            attributes=attributes,
        )
        span.end(end_time=end_ns)
        return span.get_span_context()
