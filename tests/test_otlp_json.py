"""otel.otlp_json writes exactly what the OTLP protobuf encoder + MessageToDict wrote for the
OTLP-JSON file (byte-identical lines), and leaves the values it does not expect to that path."""

from __future__ import annotations

import json
from typing import List

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from tf_otel.otel import otlp_json, sdk


def _line(data: dict) -> str:
    return json.dumps(data, separators=(",", ":"))


def _varied_spans() -> List:
    exporter = InMemorySpanExporter()
    resource = Resource.create({"service.name": "svc", "tf_otel.rank": 1}, schema_url="https://s/1")
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tf_otel", "9.9", schema_url="https://s/2")
    plain = provider.get_tracer("user")  # no version, no schema: a second scope
    remote = SpanContext(
        trace_id=0x0123456789ABCDEF0123456789ABCDEF,
        span_id=0x0011223344556677,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("k", "v"), ("a", "b")]),
    )
    attributes = {
        "s": "text",
        "empty": "",
        "b": True,
        "f": False,
        "i": 42,
        "zero": 0,
        "neg": -(2**63),
        "big": 2**63 - 1,
        "d": 1.5,
        "dz": 0.0,
        "tiny": 1e-300,
        "ints": [1, 2, 3],
        "strs": ("a", ""),
        "bools": [True, False],
        "floats": [0.25, 2.0],
        "none_list": [],
    }
    with tracer.start_as_current_span("root", attributes=attributes, kind=SpanKind.SERVER) as root:
        root.add_event("ev", {"x": 1}, timestamp=123)
        root.add_event("ev2")
        root.set_status(Status(StatusCode.ERROR, "boom"))
        with tracer.start_as_current_span("child", links=[Link(remote, {"l": "x"}), Link(remote)]):
            pass
    for kind in (SpanKind.CLIENT, SpanKind.PRODUCER, SpanKind.CONSUMER, SpanKind.INTERNAL):
        span = plain.start_span(
            "", context=set_span_in_context(NonRecordingSpan(remote)), kind=kind, start_time=5
        )
        span.set_status(Status(StatusCode.OK))
        span.end(end_time=7)
    tracer.start_span("no attrs").end()
    for same in (1, True, 1.0, "1", 0.0, -0.0, 0, False):  # one key: the encoder's cache
        tracer.start_span("same key", attributes={"v": same}).end()
    return list(exporter.get_finished_spans())


def test_fast_encoder_writes_the_protobuf_paths_bytes() -> None:
    spans = _varied_spans()
    assert _line(otlp_json.traces_data(spans)) == _line(sdk.proto_otlp_json(spans))
    for span in spans:  # one at a time too (batches of one resource / scope)
        assert _line(otlp_json.traces_data([span])) == _line(sdk.proto_otlp_json([span]))
    assert otlp_json.traces_data([]) == sdk.proto_otlp_json([])
    again = _line(otlp_json.traces_data(spans))  # from the cache this time: the same
    assert again == _line(sdk.proto_otlp_json(spans))


@pytest.mark.parametrize("value", [b"raw", {"k": 1}, float("nan"), float("inf"), 2**64])
def test_unexpected_values_take_the_protobuf_path(value: object) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("t").start_span("s")
    span._attributes._dict["odd"] = value  # type: ignore[attr-defined]  # past the SDK's checks
    span.end()
    spans = list(exporter.get_finished_spans())
    with pytest.raises(otlp_json.Unsupported):
        otlp_json.traces_data(spans)
    assert _line(sdk.spans_to_otlp_json(spans)) == _line(sdk.proto_otlp_json(spans))
