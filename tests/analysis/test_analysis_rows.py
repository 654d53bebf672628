"""The one row builder: both OTLP-JSON decoders give the same, expected ``SpanRow``s."""

from __future__ import annotations

import json
import marshal
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from tf_otel.analysis.load import files
from tf_otel.analysis.load.otlp import decode_traces_rows
from tf_otel.analysis.load.otlp_msgspec import MsgspecLineDecoder
from tf_otel.analysis.load.otlp_native import AVAILABLE as NATIVE
from tf_otel.analysis.load.otlp_native import NativeLineDecoder
from tf_otel.analysis.load.rows import FOUND_TEMPLATE, NO_ATTRIBUTES, RowBuilder
from tf_otel.analysis.model import Span, SpanRow

TRACE, SPAN, PARENT = "ab" * 16, "cd" * 8, "ef" * 8


def _attr(key: str, value: Any) -> Dict[str, Any]:
    return {"key": key, "value": value}


def _line(spans: List[Dict[str, Any]], resource: Optional[List[Dict[str, Any]]] = None) -> bytes:
    group: Dict[str, Any] = {"scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}
    if resource is not None:
        group["resource"] = {"attributes": resource}
    return json.dumps({"resourceSpans": [group]}, separators=(",", ":")).encode()


def _both(line: bytes) -> List[SpanRow]:
    """The rows of the decoders, which must agree (msgspec and the native decoder, where built,
    must take the line themselves), by name."""
    fast = MsgspecLineDecoder().decode(line, 0, len(line))
    generic = decode_traces_rows(json.loads(line), "test")
    assert fast is not None, "the fast path left a plain line to the generic path"
    assert repr(fast) == repr(generic)
    if NATIVE:
        native = NativeLineDecoder().decode(line, 0, len(line))
        assert native is not None, "the native decoder left a plain line to the others"
        assert repr(native) == repr(generic)
    assert all(type(row) is tuple for row in fast + generic)  # what marshal takes
    return [SpanRow._make(row) for row in fast]


MINIMAL = {"traceId": TRACE, "spanId": SPAN, "startTimeUnixNano": "5", "endTimeUnixNano": "9"}


def test_minimal_span_fills_the_defaults():
    (row,) = _both(_line([MINIMAL]))
    assert row == SpanRow(TRACE, SPAN, None, "", 5, 9, {}, {}, "", None, None, None, None)
    assert row.attributes is NO_ATTRIBUTES  # shared, never a new empty dict per span


def test_slots_split_from_kept_attributes_and_coerced():
    span = dict(
        MINIMAL,
        name="allreduce",
        parentSpanId=PARENT,
        attributes=[
            _attr("tf_otel.category", {"stringValue": "collective"}),
            _attr("tf_otel.rank", {"stringValue": "3"}),  # int as string
            _attr("tf_otel.step", {"intValue": "7"}),  # OTLP-JSON's int64 as string
            _attr("tf_otel.collective.key", {"stringValue": "s7/g0"}),
            _attr("gpu.utilization", {"doubleValue": 0.5}),
            _attr("tf_otel.job.id", {"intValue": 12}),
            _attr("tensorflow.op.name", {"stringValue": "not read by the analysis"}),
        ],
    )
    (row,) = _both(_line([span]))
    assert (row.category, row.rank, row.step, row.job_id, row.gpu_utilization) == (
        "collective",
        3,
        7,
        "12",
        0.5,
    )
    assert row.attributes == {"tf_otel.collective.key": "s7/g0"}
    assert (row.name, row.parent_id) == ("allreduce", PARENT)


def test_resource_rank_is_the_fallback_and_resource_job_wins():
    resource = [
        _attr("tf_otel.rank", {"intValue": "2"}),
        _attr("tf_otel.job.id", {"stringValue": "r"}),
    ]
    own = dict(MINIMAL, attributes=[_attr("tf_otel.job.id", {"stringValue": "span"})])
    ranked = dict(MINIMAL, spanId="12" * 8, attributes=[_attr("tf_otel.rank", {"intValue": 1})])
    first, second = _both(_line([own, ranked], resource))
    assert (first.rank, first.job_id, second.rank, second.job_id) == (2, "r", 1, "r")
    assert first.resource == {"tf_otel.rank": 2, "tf_otel.job.id": "r"}


def test_odd_but_valid_inputs():
    span = dict(
        MINIMAL,
        traceId=TRACE.upper(),
        spanId="AAAAAAAAAAE=",  # base64 (protobuf JSON)
        parentSpanId="0" * 16,  # all zeros: no parent
        startTimeUnixNano=30,  # a number, not a string
        endTimeUnixNano="20",  # before the start: clamped
        attributes=[
            _attr("tf_otel.step", {"intValue": "1"}),
            _attr("tf_otel.step", {"intValue": "2"}),  # repeated key: the last wins
            _attr("tf_otel.category", {"intValue": "4"}),  # not a string: as text
            _attr("tf_otel.rank", {"boolValue": True}),  # a bool is no rank
        ],
        events=[{"timeUnixNano": "25", "name": "e", "attributes": []}],  # not carried
        links=[{"traceId": TRACE, "spanId": SPAN}],  # not carried
        status={"code": 2},
    )
    (row,) = _both(_line([span]))
    assert row == SpanRow(
        TRACE, "0000000000000001", None, "", 30, 30, {}, {}, "4", None, 2, None, None
    )
    without = {k: v for k, v in span.items() if k not in ("events", "links", "status")}
    assert _both(_line([without])) == [row]


def test_rows_make_the_same_spans_in_a_worker_and_in_this_process(tmp_path: Path):
    lines = [
        _line(
            [MINIMAL, dict(MINIMAL, spanId="12" * 8, parentSpanId=SPAN)],
            [_attr("tf_otel.rank", {"intValue": "0"})],
        ),
        _line([dict(MINIMAL, attributes=[_attr("tf_otel.collective.key", {"stringValue": "k"})])]),
    ]
    path = tmp_path / "rank0.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    here = files.load_file_rows(path)
    sent, skips = marshal.loads(files._load_rows(((path, 0, -1), True)))  # a worker's answer
    assert [Span.from_row(row).to_row() for row in sent] == here and len(here) == 3
    assert skips == []


def test_row_fields_are_the_span_slots():
    assert SpanRow._fields == Span.__slots__


def test_builder_takes_slots_out_of_found():
    build = RowBuilder()
    build.set_resource({"tf_otel.rank": 4})
    found = dict(FOUND_TEMPLATE, **{"horovod.wait_ns": 5, "tf_otel.category": "compute"})
    row = SpanRow._make(build.row(TRACE, SPAN, "", None, 1, 2, found))
    assert row.attributes == {"horovod.wait_ns": 5} and row.category == "compute"
    assert row.rank == 4 and row.parent_id is None and row.name is None
    # trace and parent ids repeat: one normalised string shared by every row
    a = build.row(TRACE.upper(), SPAN, PARENT.upper(), "n", 1, 2, FOUND_TEMPLATE.copy())
    b = build.row(TRACE.upper(), "12" * 8, PARENT.upper(), "n", 1, 2, FOUND_TEMPLATE.copy())
    assert a[0] is b[0] and a[2] is b[2] == PARENT  # trace_id, parent_id


@pytest.mark.parametrize(
    "bad", [{"traceId": 7}, {"spanId": "not an id"}, {"startTimeUnixNano": "x"}]
)
def test_malformed_spans_fail_on_the_generic_path_and_are_left_by_the_fast_one(bad):
    line = _line([dict(MINIMAL, **bad)])
    assert MsgspecLineDecoder().decode(line, 0, len(line)) is None
    with pytest.raises(Exception, match="malformed OTLP-JSON span"):
        decode_traces_rows(json.loads(line), "test")


def test_kept_attributes_keep_their_order_and_the_last_repeated_value():
    span = dict(
        MINIMAL,
        attributes=[
            _attr("horovod.wait_ns", {"intValue": "1"}),
            _attr("tf_otel.category", {"stringValue": "collective"}),
            _attr("tf_otel.collective.key", {"stringValue": "k"}),
            _attr("horovod.wait_ns", {"intValue": "2"}),
        ],
    )
    (row,) = _both(_line([span]))
    assert list(row.attributes.items()) == [("horovod.wait_ns", 2), ("tf_otel.collective.key", "k")]
