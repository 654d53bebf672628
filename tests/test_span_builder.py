"""otel.span_builder: a directly built child span is the span the SDK would have built (all
but its random span id), and any set-up where that is not certain goes through the SDK."""

from __future__ import annotations

import json
from typing import Any, List, Tuple

import pytest
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from tf_otel.otel import sdk
from tf_otel.otel.span_builder import SpanBuilder

PARENT = SpanContext(
    trace_id=0xABCDEF0123456789ABCDEF0123456789,
    span_id=0x1122334455667788,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.SAMPLED | getattr(TraceFlags, "RANDOM_TRACE_ID", 0)),
    trace_state=TraceState([("k", "v")]),
)
ATTRS = {"tf_otel.category": "collective", "tf_otel.rank": 1, "x.wait": 2.5, "x.last": True}


def _provider(sampler: Any = None) -> Tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _masked(spans: List[Any]) -> List[dict]:
    data = sdk.proto_otlp_json(spans)
    for rs in data["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                span["spanId"] = "masked"
    return json.loads(json.dumps(data))


def test_direct_span_equals_the_sdks_but_for_its_id() -> None:
    provider, exporter = _provider()
    builder = SpanBuilder(provider.get_tracer("tf_otel", "1.0"))
    direct = builder.finished("horovod.allreduce g", PARENT, 100, 200, dict(ATTRS))
    via_sdk = builder._emit_sdk("horovod.allreduce g", PARENT, 100, 200, dict(ATTRS))
    assert builder._direct is True
    spans = exporter.get_finished_spans()
    assert len(spans) == 2 and spans[0].context.span_id == direct.span_id
    assert direct.span_id != via_sdk.span_id
    assert (direct.trace_id, direct.trace_flags, direct.trace_state) == (
        via_sdk.trace_id,
        via_sdk.trace_flags,
        via_sdk.trace_state,
    )
    assert _masked([spans[0]]) == _masked([spans[1]])
    assert dict(spans[0].attributes) == ATTRS and spans[0].parent == PARENT


def test_set_ups_the_direct_path_cannot_match_go_through_the_sdk() -> None:
    started: List[str] = []

    class OnStart(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            started.append(span.name)

    provider, _ = _provider()
    provider.add_span_processor(OnStart())
    builder = SpanBuilder(provider.get_tracer("t"))
    builder.finished("a", PARENT, 1, 2, dict(ATTRS))
    assert builder._direct is False and started == ["a"]  # the user's on_start still runs

    for sampler in (ALWAYS_OFF, TraceIdRatioBased(0.5), ParentBased(ALWAYS_OFF, ALWAYS_OFF)):
        provider, exporter = _provider(sampler)
        builder = SpanBuilder(provider.get_tracer("t"))
        builder.finished("b", PARENT, 1, 2, dict(ATTRS))
        assert builder._direct is False

    provider, exporter = _provider()
    builder = SpanBuilder(provider.get_tracer("t"))
    builder.finished("c", PARENT, 1, 2, {"odd": None, "ok": 1})  # the SDK's cleaning decides
    builder.finished("d", PARENT, 1, 2, {"ok": 1})
    assert builder._direct is True
    odd, plain = exporter.get_finished_spans()
    # the SDK's spans carry BoundedAttributes (cleaned); direct ones the record's own dict
    assert isinstance(odd._attributes, BoundedAttributes)
    assert not isinstance(plain._attributes, BoundedAttributes)


def _one_span_beside(processor: Any) -> Tuple[SpanBuilder, InMemorySpanExporter, Any]:
    """One span built with ``processor`` added beside an in-memory exporter."""
    provider, exporter = _provider()
    provider.add_span_processor(processor)
    builder = SpanBuilder(provider.get_tracer("t"))
    ctx = builder.finished("e", PARENT, 10, 20, dict(ATTRS))
    return builder, exporter, ctx


def test_tf_otels_own_clock_shift_processor_keeps_the_direct_path() -> None:
    from tf_otel.instrument.step_context import ClockShiftProcessor

    builder, exporter, ctx = _one_span_beside(ClockShiftProcessor())
    assert builder._direct is True
    (span,) = exporter.get_finished_spans()
    assert (span.start_time, span.end_time, span.context.span_id) == (10, 20, ctx.span_id)


class _OnlyOnEnd(SpanProcessor):
    """Like delivery's end counter: no on_start of its own."""

    def __init__(self) -> None:
        self.ended = 0

    def on_end(self, span: Any) -> None:
        self.ended += 1


class _WithOnStart(_OnlyOnEnd):
    def on_start(self, span: Any, parent_context: Any = None) -> None:
        span.set_attribute("user.added", 1)


def test_a_processor_without_on_start_keeps_the_direct_path_and_sees_every_span() -> None:
    counter = _OnlyOnEnd()
    builder, exporter, _ = _one_span_beside(counter)
    assert builder._direct is True
    assert counter.ended == 1 and len(exporter.get_finished_spans()) == 1


def test_tf_otels_own_set_up_takes_the_direct_path(tmp_path: Any) -> None:
    """The processors tf_otel itself installs at start-up (the file exporter's batch processor,
    the loss counter) must not turn the direct path off: detail spans then cost ~3x the CPU."""
    import os
    import subprocess
    import sys

    code = (
        "from opentelemetry import trace\n"
        "from tf_otel.otel.span_builder import SpanBuilder\n"
        "from tf_otel.instrument import step_context\n"
        "tracer = trace.get_tracer('tf_otel')\n"
        "kinds = sorted(type(p).__name__ for p in tracer.span_processor._span_processors)\n"
        "print(kinds, SpanBuilder(tracer)._eligible())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TF_OTEL_"))}
    env.update(
        TF_OTEL_ENABLED="1",
        TF_OTEL_FILE=str(tmp_path / "spans.jsonl"),
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    assert "_EndCounter" in line and "BatchSpanProcessor" in line, line
    assert line.endswith("True"), line


class _OnEnding(_OnlyOnEnd):
    """Overrides the hook the SDK calls as a span ends (as step_context's clock shift does)."""

    def _on_ending(self, span: Any) -> None:
        self.ended += 100


@pytest.mark.parametrize("kind", [_WithOnStart, _OnEnding])
def test_a_processor_with_its_own_start_or_ending_hook_goes_through_the_sdk(kind: Any) -> None:
    processor = kind()
    builder, exporter, _ = _one_span_beside(processor)
    assert builder._direct is False
    (span,) = exporter.get_finished_spans()
    if kind is _WithOnStart:
        assert span.attributes["user.added"] == 1
    else:  # the SDK called its _on_ending, then its on_end
        assert processor.ended == 101
