"""Fuzzed OTLP-JSON trace files (tf_otel.analysis.load): newline-delimited and whole documents,
gzip, parts of big files, the native and msgspec fast paths and the generic path, Jaeger UI
downloads.
Arbitrary bytes, and JSON of the right shape with wrong types, huge numbers, deep nesting and
missing fields. The contract: spans, or the one ``AnalysisError`` whose message names the file
(and the line, for newline-delimited files); never another exception, in bounded time. And each
fast path gives the generic path's rows, or leaves the line to it.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))

from spill_pieces import native_pieces, python_pieces  # noqa: E402

from tf_otel.analysis.errors import AnalysisError  # noqa: E402
from tf_otel.analysis.load import files  # noqa: E402
from tf_otel.analysis.load.jaeger import convert_jaeger_traces  # noqa: E402
from tf_otel.analysis.load.otlp import decode_traces_rows  # noqa: E402
from tf_otel.analysis.load.otlp_msgspec import MsgspecLineDecoder  # noqa: E402
from tf_otel.analysis.load.otlp_native import AVAILABLE as NATIVE  # noqa: E402
from tf_otel.analysis.load.otlp_native import NativeLineDecoder  # noqa: E402
from tf_otel.analysis.skeleton import SKELETON_SETS  # noqa: E402

FUZZ = settings(
    max_examples=200,
    deadline=3000,  # ms per example: generous for a loaded 2-core machine, still "bounded"
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
RANK, STEP, CATEGORY = "tf_otel.rank", "tf_otel.step", "tf_otel.category"

_numbers = st.sampled_from(
    [0, -1, 2**63 - 1, 2**63, -(2**63), 2**64, 10**30, 1e300, -1e300, 0.5, 1e-300]
) | st.integers() | st.floats(allow_nan=False, allow_infinity=False)  # fmt: skip
_strings = st.sampled_from(
    ["", "10", "-5", "1e3", "inf", "-inf", "nan", "NaN", "9" * 30, "1" * 5000, "ab" * 16, "cd" * 8,
     "q80AAAAAAAAAAAAAAAAAAA==", "AAAAAAAAAAE=", "0" * 32, "zz" * 16, "\x00", "é" * 16]
) | st.text(max_size=12)  # fmt: skip
_scalar = st.none() | st.booleans() | _numbers | _strings
_json = st.recursive(
    _scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_strings, inner, max_size=3),
    max_leaves=8,
)


def _nested(inner):
    array = st.fixed_dictionaries({"values": st.lists(inner, max_size=2)})
    pair = st.fixed_dictionaries({"key": _strings, "value": inner})
    kvlist = st.fixed_dictionaries({"values": st.lists(pair, max_size=2)})
    return st.fixed_dictionaries({"arrayValue": array}) | st.fixed_dictionaries(
        {"kvlistValue": kvlist}
    )


_scalar_value = st.fixed_dictionaries(
    {},
    optional={
        k: _scalar for k in ("stringValue", "intValue", "doubleValue", "boolValue", "bytesValue")
    },
)
_any_value = st.recursive(_scalar_value, _nested, max_leaves=4) | _json
_keys = st.sampled_from(
    [RANK, STEP, CATEGORY, "tf_otel.job.id", "gpu.utilization", "tensorflow.op.name",
     "tf_otel.collective.key", "other"]
) | _json  # fmt: skip
_attributes = (
    st.lists(
        st.fixed_dictionaries({"key": _keys}, optional={"value": _any_value}) | _json, max_size=4
    )
    | _json
)
_span = st.fixed_dictionaries(
    {},
    optional={
        "traceId": _strings | _json, "spanId": _strings | _json,
        "parentSpanId": _strings | _json, "name": _strings | _json,
        "startTimeUnixNano": _numbers | _strings | _json,
        "endTimeUnixNano": _numbers | _strings | _json,
        "attributes": _attributes,
    },
)  # fmt: skip
_good_span = st.fixed_dictionaries(
    {"traceId": st.just("ab" * 16), "spanId": st.sampled_from(["cd" * 8, "AAAAAAAAAAE="]),
     "startTimeUnixNano": _numbers | _strings, "endTimeUnixNano": _numbers | _strings},
    optional={"attributes": _attributes, "parentSpanId": _strings, "name": _strings},
)  # fmt: skip
_scope = st.fixed_dictionaries(
    {}, optional={"spans": st.lists(_good_span | _span, max_size=3) | _json}
)
_resource_spans = st.fixed_dictionaries(
    {},
    optional={
        "resource": st.fixed_dictionaries({}, optional={"attributes": _attributes}) | _json,
        "scopeSpans": st.lists(_scope, max_size=2) | _json,
        "instrumentationLibrarySpans": st.lists(_scope, max_size=2),
    },
)
# well-formed TracesData with odd but legal values (so that many examples decode to spans)
_time = st.integers(-(2**63), 2**63 - 1) | st.integers(0, 2**70).map(str)
_legal_value = (
    st.fixed_dictionaries({"stringValue": st.text(max_size=8)})
    | st.fixed_dictionaries({"intValue": st.integers(-(2**70), 2**70).map(str)})
    | st.fixed_dictionaries({"intValue": st.integers(-(2**63), 2**63 - 1)})
    | st.fixed_dictionaries({"doubleValue": st.floats(allow_nan=False, allow_infinity=False)})
    | st.fixed_dictionaries({"boolValue": st.booleans()})
)
_legal_attributes = st.lists(
    st.fixed_dictionaries({"key": _keys.filter(str.__instancecheck__), "value": _legal_value}),
    max_size=4,
)
_legal_span = st.fixed_dictionaries(
    {"traceId": st.sampled_from(["ab" * 16, "AB" * 16, "q80AAAAAAAAAAAAAAAAAAA==", "0" * 32]),
     "spanId": st.sampled_from(["cd" * 8, "AAAAAAAAAAE=", "0" * 16]),
     "startTimeUnixNano": _time, "endTimeUnixNano": _time},
    optional={"parentSpanId": st.sampled_from(["", "ef" * 8, None]), "name": st.text(max_size=8),
              "attributes": _legal_attributes},
)  # fmt: skip
_legal = st.fixed_dictionaries(
    {"resourceSpans": st.lists(st.fixed_dictionaries(
        {"resource": st.fixed_dictionaries({"attributes": _legal_attributes}),
         "scopeSpans": st.lists(st.fixed_dictionaries(
             {"spans": st.lists(_legal_span, min_size=1, max_size=3)}), min_size=1, max_size=2)}
    ), min_size=1, max_size=2)}
)  # fmt: skip
TRACES_DATA = (
    _legal
    | st.fixed_dictionaries({"resourceSpans": st.lists(_resource_spans, max_size=2) | _json})
    | st.fixed_dictionaries({"batches": st.lists(_resource_spans, max_size=2)})
    | _json
)
JAEGER_SPAN = st.fixed_dictionaries(
    {},
    optional={
        "traceID": _strings | _json, "spanID": _strings | _json, "startTime": _numbers | _strings,
        "duration": _numbers | _strings | _json, "operationName": _json, "processID": _json,
        "references": st.lists(st.fixed_dictionaries(
            {"refType": st.just("CHILD_OF")}, optional={"spanID": _strings | _json})) | _json,
        "tags": st.lists(st.fixed_dictionaries(
            {"key": _keys}, optional={"type": st.sampled_from(["int64", "float64", "string"]),
                                      "value": _json})) | _json,
    },
)  # fmt: skip
JAEGER_TRACE = st.fixed_dictionaries(
    {"traceID": _strings | _json},
    optional={
        "spans": st.lists(JAEGER_SPAN, max_size=3) | _json,
        "processes": st.dictionaries(_strings, st.fixed_dictionaries(
            {}, optional={"serviceName": _json, "tags": _json})) | _json,
    },
)  # fmt: skip

DEEP_ANY = {"stringValue": "x"}
for _ in range(300):
    DEEP_ANY = {"arrayValue": {"values": [DEEP_ANY]}}


def _dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _wrap(attribute_value, key=RANK, value_first=False):
    pair = (
        {"value": attribute_value, "key": key}
        if value_first
        else {"key": key, "value": attribute_value}
    )
    span = {
        "traceId": "ab" * 16,
        "spanId": "cd" * 8,
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "2",
        "attributes": [pair],
    }
    return {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}


def clear(error: AnalysisError, path: Path, lines: int) -> None:
    """The message starts with the file's name; a line it names is one of the file's."""
    message = str(error)
    assert message.startswith(f"{path}"), message
    named = re.search(r"line (\d+)", message[len(str(path)) :])
    if named:
        assert 1 <= int(named.group(1)) <= lines, message


def load(path: Path, lines: int):
    """load_file's spans, or its AnalysisError checked to name ``path``."""
    try:
        return files.load_file(path)
    except AnalysisError as error:
        clear(error, path, lines)
        return None


@FUZZ
@given(TRACES_DATA)
@example(_wrap({"doubleValue": "inf"}))  # rank inf: was OverflowError (both paths)
@example(_wrap({"doubleValue": "-inf"}, key=STEP))
@example({"resourceSpans": [{"scopeSpans": [[]]}]})  # native: a scope from an array (was [])
# native, the general parser's pairs (the key after its value): sonic-rs read -0.0 as 0.0
@example(_wrap({"doubleValue": -0.0}, key="gpu.utilization", value_first=True))
@example(_wrap({"doubleValue": -0.0}, key="gpu.utilization"))  # the scanner's pairs
# job ids {"0.0", ""}: one set from each side, equal, printed in different orders
@example(
    {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {"traceId": "ab" * 16, "spanId": "cd" * 8, "attributes": [pair]}
                            for pair in (
                                {"key": "tf_otel.job.id", "value": {"doubleValue": 0.0}},
                                {"key": "tf_otel.job.id", "value": {"stringValue": ""}},
                            )
                        ]
                    }
                ]
            }
        ]
    }
)
def test_fast_path_gives_the_generic_rows_or_leaves_the_line(document):
    line = _dumps(document)
    fast = MsgspecLineDecoder().decode(line, 0, len(line))
    native = NativeLineDecoder().decode(line, 0, len(line)) if NATIVE else None
    spilled = None
    if NATIVE:
        spilled = NativeLineDecoder().spill_block(line, len(line), SKELETON_SETS)
    try:
        generic = decode_traces_rows(document, "x line 1")
    except AnalysisError as error:
        assert str(error).startswith("x line 1: "), error
        assert fast is None and native is None and spilled is None
        return
    if fast is not None:
        assert fast == generic
    if native is not None:
        assert repr(native) == repr(generic)  # (NaN != NaN)
    if spilled is not None:  # the spill's pieces as the Python path writes them
        assert repr(native_pieces(spilled)) == repr(python_pieces(generic))


def test_attribute_values_nested_as_deep_as_the_json_parser_allows(tmp_path):
    """~300 nested arrayValues (orjson stops at 1024 levels): spans or one clear error, under a
    deep caller stack too (hypothesis's made it a RecursionError out of both paths)."""
    document = _wrap(DEEP_ANY, key="tensorflow.op.name")
    line = _dumps(document)
    path = tmp_path / "deep.jsonl"
    path.write_bytes(line + b"\n")

    def nested(depth):
        if depth:
            return nested(depth - 1)
        MsgspecLineDecoder().decode(line, 0, len(line))  # rows or None, never raises
        if NATIVE:
            NativeLineDecoder().decode(line, 0, len(line))
        try:
            decode_traces_rows(document, "x")
        except AnalysisError as error:
            assert "x: malformed OTLP-JSON span" in str(error)
        load(path, 1)

    for depth in (0, 200, 400):
        nested(depth)


@settings(FUZZ, max_examples=120)
@given(st.lists(TRACES_DATA, min_size=1, max_size=4), st.booleans(), st.booleans())
@example([{"resourceSpans": []}, b'{"a":' * 1100], False, False)  # was RecursionError (msgspec)
@example([b'{"resourceSpans":' + b"[" * 2000], False, False)
def test_newline_delimited_files(tmp_path, documents, pretty, compress):
    lines = [d if isinstance(d, bytes) else _dumps(d) for d in documents]
    data = b"\n".join(lines) + b"\n"
    if pretty and not isinstance(documents[0], bytes):
        data = json.dumps(documents[0], indent=2).encode()  # one whole-file document
    if compress:
        data = gzip.compress(data)
    path = tmp_path / "traces.jsonl"
    path.write_bytes(data)
    load(path, len(lines))


@FUZZ
@given(
    st.binary(max_size=3000) | st.sampled_from([b"\x1f\x8b", b"\x1f\x8b\x08\x00garbage", b"\n\n"])
)
def test_arbitrary_bytes(tmp_path, data):
    path = tmp_path / "traces.json"
    path.write_bytes(data)
    load(path, len(data.splitlines()))


@FUZZ
@given(st.lists(TRACES_DATA, min_size=2, max_size=6), st.data())
def test_parts_of_a_big_file_name_the_file_and_line(tmp_path, documents, data):
    lines = [_dumps(d) + b"\n" for d in documents]
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"".join(lines))
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    cuts = sorted(set(data.draw(st.lists(st.sampled_from(offsets[1:-1]), max_size=3))))
    bounds = [0, *cuts, offsets[-1]]
    for start, end in zip(bounds, bounds[1:]):
        try:
            files.load_part_rows((path, start, end))
        except AnalysisError as error:
            clear(error, path, len(lines))


@FUZZ
@given(st.lists(JAEGER_TRACE, max_size=3) | _json)
def test_jaeger_documents(tmp_path, traces):
    try:
        convert_jaeger_traces(traces, "origin")
    except AnalysisError as error:
        assert str(error).startswith("origin: "), error
    path = tmp_path / "jaeger.json"
    data = json.dumps({"data": traces}, indent=1).encode()
    path.write_bytes(data)
    load(path, len(data.splitlines()))
