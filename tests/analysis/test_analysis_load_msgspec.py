"""The msgspec fast path gives the generic path's rows, or leaves the line to it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List

import msgspec  # noqa: E402,F401 - a dev dependency; its absence is a failure
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load_switches import rows_or_error  # noqa: E402

from tf_otel.analysis.load.otlp import decode_traces_rows  # noqa: E402
from tf_otel.analysis.load.otlp_msgspec import MsgspecLineDecoder  # noqa: E402


def _span(**changes: Any) -> Dict[str, Any]:
    span = {
        "traceId": "ab" * 16,
        "spanId": "cd" * 8,
        "parentSpanId": "ef" * 8,
        "name": "allreduce",
        "kind": 1,
        "startTimeUnixNano": "10",
        "endTimeUnixNano": "20",
        "attributes": [
            {"key": "tf_otel.category", "value": {"stringValue": "collective"}},
            {"key": "tf_otel.step", "value": {"intValue": "7"}},
            {"key": "tensorflow.op.name", "value": {"stringValue": "x"}},
            {"key": "tf_otel.collective.key", "value": {"stringValue": "s7/g0"}},
        ],
        "status": {},
    }
    span.update(changes)
    return span


def _line(spans: List[Dict[str, Any]], **resource_spans: Any) -> bytes:
    resource = {"attributes": [{"key": "tf_otel.rank", "value": {"intValue": "3"}}]}
    group = {"resource": resource, "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}
    group.update(resource_spans)
    return json.dumps({"resourceSpans": [group]}, separators=(",", ":")).encode()


def _attr(key: str, value: Any) -> Dict[str, Any]:
    return {"key": key, "value": value}


FAST = [
    _line([_span()]),
    _line([_span(), _span(spanId="12" * 8, parentSpanId="")]),
    _line([_span(traceId="q80AAAAAAAAAAAAAAAAAAA==", spanId="AAAAAAAAAAE=")]),  # base64 ids
    _line([_span(traceId="AB" * 16, spanId="CD" * 8, parentSpanId=None)]),
    _line([_span(startTimeUnixNano=30, endTimeUnixNano="20")]),  # end clamped
    _line([_span(startTimeUnixNano=-(2**63), endTimeUnixNano=2**63 - 1)]),
    _line([_span(name=None, attributes=None)]),
    _line([_span(attributes=[])]),
    _line([_span(attributes=[_attr("tf_otel.rank", {"stringValue": "5"})])]),
    _line([_span(attributes=[_attr("tf_otel.rank", {"intValue": 5})])]),
    _line([_span(attributes=[_attr("gpu.utilization", {"doubleValue": 0.5})])]),
    _line([_span(attributes=[_attr("gpu.utilization", {"doubleValue": "NaN"})])]),
    _line([_span(attributes=[_attr("horovod.last_arrival", {"boolValue": True})])]),
    _line([_span(attributes=[_attr("tf_otel.step", {})])]),
    _line([_span(attributes=[{"key": "tf_otel.step"}])]),  # no value
    _line([_span(attributes=[_attr("tf_otel.step", None)])]),
    _line([_span(attributes=[_attr("tf_otel.category", {"intValue": "4"})])]),
    _line([_span(attributes=[_attr("tf_otel.step", {"stringValue": "1", "intValue": "2"})])]),
    _line([_span(attributes=[_attr("tf_otel.job.id", {"arrayValue": {"values": []}})])]),
    _line([_span(attributes=[_attr("other", {"kvlistValue": {"values": []}})])]),
    _line([_span()], resource={}),
    _line([_span()], resource=None),
    _line([_span(attributes=[_attr("tf_otel.job.id", {"stringValue": "j"})])]),
]

TRUNCATED = b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"ab"'
BAD_SPAN_ID = _line([_span(spanId="not an id")])
GENERIC = [  # left to the generic path (which decodes them or names the error)
    b'{"batches":[{"scopeSpans":[{"spans":[]}]}]}',
    b'{"resourceSpans":[]}',
    json.dumps({"resourceSpans": [{"instrumentationLibrarySpans": [{"spans": [_span()]}]}]})
    .replace(" ", "")
    .encode(),
    _line([_span(traceId=12)]),
    BAD_SPAN_ID,
    _line([_span(startTimeUnixNano=1.5e3)]),
    _line([_span(startTimeUnixNano=2**64)]),  # orjson: a float
    _line([_span(startTimeUnixNano="ten")]),
    _line([_span(attributes=[_attr("tf_otel.step", {"intValue": "seven"})])]),
    _line([_span(attributes=[{"value": {"stringValue": "no key"}}])]),
    _line([_span(name=3)]),
    TRUNCATED,
    b'{"data":[]}',
    b"[1, 2]",
]


@pytest.mark.parametrize("line", FAST)
def test_fast_rows_equal_the_generic_rows(line: bytes):
    rows = MsgspecLineDecoder().decode(line, 0, len(line))
    assert rows is not None
    assert repr(rows) == repr(decode_traces_rows(json.loads(line), "test"))  # (NaN != NaN)


@pytest.mark.parametrize("line", GENERIC)
def test_unusual_lines_are_left_to_the_generic_path(line: bytes):
    assert MsgspecLineDecoder().decode(line, 0, len(line)) is None


def test_value_cache_keeps_rows_independent():
    decoder = MsgspecLineDecoder()
    line = _line([_span()])
    first = decoder.decode(line, 0, len(line))
    second = decoder.decode(line, 0, len(line))
    assert first == second and first is not None and second is not None
    assert first[0][6] is not second[0][6]  # each span's kept attributes: its own dict


@pytest.mark.parametrize("lines", [FAST, [FAST[0], GENERIC[0], FAST[1]], [FAST[0], BAD_SPAN_ID]])
def test_files_load_the_same_with_and_without_msgspec(tmp_path: Path, monkeypatch, lines):
    path = tmp_path / "rank0.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    fast = rows_or_error(path, monkeypatch, "msgspec")
    assert repr(fast) == repr(rows_or_error(path, monkeypatch, "reference"))


def test_bad_line_after_fast_lines_names_file_and_line(tmp_path: Path, monkeypatch):
    path = tmp_path / "rank0.jsonl"
    path.write_bytes(FAST[0] + b"\n" + FAST[1] + b"\n" + TRUNCATED + b"\n")
    assert (
        rows_or_error(path, monkeypatch, "msgspec")
        == f"{path}: line 3 is not valid JSON (truncated or corrupt file)"
    )
