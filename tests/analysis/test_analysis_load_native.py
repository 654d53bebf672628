"""The native decoder (tf_otel_native, built by ``make install``) gives the generic path's rows,
or leaves the line to the other paths; files load the same with it and without it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, List, Optional, Tuple

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from load_switches import rows_or_error  # noqa: E402
from test_analysis_load_msgspec import (  # noqa: E402
    BAD_SPAN_ID,
    FAST,
    GENERIC,
    TRUNCATED,
    _attr,
    _line,
    _span,
)

from tf_otel.analysis.errors import AnalysisError  # noqa: E402
from tf_otel.analysis.load import otlp_native  # noqa: E402
from tf_otel.analysis.load._json import loads  # noqa: E402
from tf_otel.analysis.load.otlp import decode_traces_rows  # noqa: E402
from tf_otel.analysis.model import Row  # noqa: E402

# FAST lines the native decoder leaves to the others: -(2**63) does not fit its digit parser
NATIVE_LEAVES = {5}


def test_the_native_decoder_is_built_wherever_rust_is():
    """make install builds it when cargo exists: its absence there is a broken install."""
    if shutil.which("cargo") is not None:
        assert otlp_native.AVAILABLE, "tf_otel_native is not built: run make install"
    else:  # the product still loads files: the other paths
        assert not otlp_native.AVAILABLE or otlp_native.tf_otel_native is not None


needs_native = pytest.mark.skipif(
    not otlp_native.AVAILABLE, reason="no Rust toolchain here (the test above checks why)"
)


def _native(line: bytes) -> Optional[List[Row]]:
    return otlp_native.NativeLineDecoder().decode(line, 0, len(line))


@needs_native
@pytest.mark.parametrize("index", range(len(FAST)))
def test_native_rows_equal_the_generic_rows(index: int):
    line = FAST[index]
    rows = _native(line)
    if index in NATIVE_LEAVES:
        assert rows is None
        return
    assert rows is not None, "a plain line was left to the other paths"
    assert repr(rows) == repr(decode_traces_rows(json.loads(line), "test"))  # (NaN != NaN)
    assert all(type(row) is tuple for row in rows)  # what marshal takes


@needs_native
@pytest.mark.parametrize("line", GENERIC)
def test_unusual_lines_are_left_to_the_other_paths(line: bytes):
    assert _native(line) is None


UNUSUAL = [
    _line([_span(startTimeUnixNano=" 10")]),  # int() takes it; the native parser does not
    _line([_span(startTimeUnixNano="+10")]),
    _line([_span(startTimeUnixNano="1_0")]),
    _line([_span(startTimeUnixNano="")]),
    _line([_span(startTimeUnixNano=True)]),
    _line([_span(endTimeUnixNano=None)]),
    b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"' + b"ab" * 16 + b'",'
    b'"traceId":"' + b"cd" * 16 + b'","spanId":"' + b"12" * 8 + b'",'
    b'"startTimeUnixNano":"1","endTimeUnixNano":"2"}]}]}]}',  # a repeated key
    _line([_span(traceId="é" * 32)]),
    b"",
    b"   ",
    # objects given as arrays of their fields (serde's derive would take them)
    b'{"resourceSpans":[{"scopeSpans":[[]]}]}',
    b'{"resourceSpans":[[null,[]]]}',
    _line([["ab" * 16, "cd" * 8, None, "n", "1", "2", []]]),  # type: ignore[list-item]
    _line([_span(attributes=[["tf_otel.rank", {"intValue": "3"}]])]),
    _line([_span(attributes=[_attr("tf_otel.category", ["collective"])])]),
]


@needs_native
@pytest.mark.parametrize("line", UNUSUAL)
def test_lines_it_may_leave_give_the_generic_rows_or_nothing(line: bytes):
    rows = _native(line)
    try:
        generic: Any = decode_traces_rows(json.loads(line), "test")
    except (AnalysisError, ValueError):
        assert rows is None
        return
    assert rows is None or repr(rows) == repr(generic)


@needs_native
def test_each_span_gets_its_own_kept_attributes_and_a_shared_empty_dict():
    decoder = otlp_native.NativeLineDecoder()
    line = _line([_span(), _span(spanId="12" * 8), _span(spanId="34" * 8, attributes=[])])
    first = decoder.decode(line, 0, len(line))
    second = decoder.decode(line, 0, len(line))
    assert first is not None and second is not None and first == second
    assert first[0][6] == {"tf_otel.collective.key": "s7/g0"}
    assert first[0][6] is not first[1][6] and first[0][6] is not second[0][6]
    assert first[2][6] is second[2][6]  # no kept attribute: the one shared empty dict
    list_value = _line([_span(attributes=[_attr("tf_otel.job.id", {"arrayValue": {}})])] * 2)
    rows = decoder.decode(list_value, 0, len(list_value))
    assert rows is not None and rows[0][11] == rows[1][11] == "[]"


@needs_native
def test_a_line_is_read_between_its_bounds_only():
    data = b"garbage" + FAST[0] + b"\ntrailing"
    rows = otlp_native.NativeLineDecoder().decode(data, 7, 7 + len(FAST[0]))
    assert repr(rows) == repr(decode_traces_rows(json.loads(FAST[0]), "test"))
    with pytest.raises(Exception, match=f"bad line bounds 5..{len(data) + 1} of {len(data)} "):
        otlp_native.NativeLineDecoder().decode(data, 5, len(data) + 1)


@needs_native
@pytest.mark.parametrize(
    "lines",
    [FAST, [FAST[0], GENERIC[0], FAST[1]], [FAST[0], BAD_SPAN_ID], [FAST[0], b"", FAST[1]]],
)
def test_files_load_the_same_with_and_without_it(tmp_path: Path, monkeypatch, lines):
    path = tmp_path / "rank0.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    native = rows_or_error(path, monkeypatch, "native")
    assert repr(native) == repr(rows_or_error(path, monkeypatch, "reference"))


@needs_native
def test_bad_line_after_native_lines_names_file_and_line(tmp_path: Path, monkeypatch):
    path = tmp_path / "rank0.jsonl"
    path.write_bytes(FAST[0] + b"\n" + FAST[1] + b"\n" + TRUNCATED + b"\n")
    expected = f"{path}: line 3 is not valid JSON (truncated or corrupt file)"
    assert rows_or_error(path, monkeypatch, "native") == expected


@needs_native
def test_the_benchmarks_traces_load_the_same_and_all_natively(tmp_path: Path, monkeypatch):
    """bench_analysis.py's traces (what TF_OTEL_FILE writes, 512 spans a line): every line
    taken natively, the rows those of the other paths."""
    import bench_analysis

    bench_analysis.generate(tmp_path, steps=3, ranks=2)
    for path in sorted(tmp_path.glob("rank*.jsonl")):
        data = path.read_bytes()
        decoder = otlp_native.NativeLineDecoder()
        rows: List[Row] = []
        begin = 0
        for line in data.splitlines():
            found = decoder.decode(data, begin, begin + len(line))
            assert found is not None
            rows.extend(found)
            begin += len(line) + 1
        assert decoder.bailed == 0
        assert decoder.scanned == len(data.splitlines())  # the scanner, not the parser
        assert decoder.lists_scanned > 0  # ... and its attribute lists
        # the spans of a step repeat a few lists: most taken by one comparison
        assert decoder.lists_recent >= 0.8 * len(rows), (decoder.lists_recent, len(rows))
        assert repr(rows) == repr(rows_or_error(path, monkeypatch, "reference"))
        assert len(rows) == 3 * 200 + (3 if path.name == "rank0.jsonl" else 0)


class _Counting(otlp_native._Helper):
    def __init__(self) -> None:
        super().__init__()
        self.tails = 0

    def tail(self, resource: Any, raw: bytes) -> Any:
        self.tails += 1
        return super().tail(resource, raw)


@needs_native
def test_plain_attribute_lists_never_call_python_and_others_do():
    """The decoder makes a plain list's row fields itself (what makes it fast) and asks the
    helper for the rest: the same rows either way."""
    helper = _Counting()
    decoder = otlp_native.tf_otel_native.LineDecoder(
        helper, list(otlp_native.SLOT_KEYS), sorted(otlp_native.ANALYSIS_ATTRIBUTES)
    )
    plain = [
        _line([_span()]),
        _line([_span(attributes=[_attr("tf_otel.rank", {"intValue": 5})])]),
        _line([_span(attributes=[_attr("gpu.utilization", {"doubleValue": 0.5})])]),
        _line([_span(attributes=[_attr("horovod.last_arrival", {"boolValue": True})])]),
        _line([_span(attributes=[_attr("tf_otel.step", {"intValue": "1"})] * 2)]),
    ]
    unusual = [
        _line([_span(attributes=[_attr("tf_otel.rank", {"stringValue": "5"})])]),
        _line([_span(attributes=[_attr("tf_otel.job.id", {"arrayValue": {"values": []}})])]),
        _line([_span(attributes=[_attr("tf_otel.step", {"stringValue": "1", "intValue": "2"})])]),
        _line([_span(attributes=[{"key": "tf_otel.step"}])]),
    ]
    for lines, calls in ((plain, 0), (unusual, len(unusual))):
        for line in lines:
            rows = decoder.decode(line, 0, len(line))
            assert repr(rows) == repr(decode_traces_rows(json.loads(line), "test"))
        assert helper.tails == calls


def _generic(line: bytes) -> Optional[List[Row]]:
    """The generic path's rows (the product's JSON module), None where it refuses the line."""
    try:
        return decode_traces_rows(loads(line), "test")
    except (AnalysisError, ValueError, TypeError, AttributeError, KeyError):
        return None


def _scanned(line: bytes) -> Tuple[Optional[List[Row]], int]:
    decoder = otlp_native.NativeLineDecoder()
    return decoder.decode(line, 0, len(line)), decoder.scanned


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


_PLAIN = _line([_span()])
_SPAN_END = _PLAIN.rindex(b"}]}]}]}")  # where the span's object closes

# Lines the scanner reads (the rows are the generic path's)
SCANNED = [
    json.dumps(json.loads(_PLAIN)).encode(),  # spaces after ',' and ':'
    b" " + _PLAIN + b"  ",
    _line([_span(status={"message": 'a "quoted" \\ slash\n', "code": 2})]),
    _line([_span(flags=[1, -2.5, 0.25, True, False, None, {"a": [[], {}]}])]),
    _line([_span(status={"d": _nested(40)})]),
    _line([_span(attributes=[_attr("tf_otel.job.id", {"stringValue": 'x"]}\\'})])]),
    _line([_span(attributes=[_attr("odd]", {"stringValue": "[{"})])]),
    _line([_span(attributes=[])]),
    _line([_span(attributes=None)]),
    _PLAIN.replace(b'"resource":', b'"other":', 1),  # no resource
    _PLAIN.replace(b'"resource":', b'"other":', 1)[:-3]  # the resource after its spans
    + b',"resource":{"attributes":[{"key":"tf_otel.rank","value":{"intValue":"5"}}]}}]}',
    _line([_span(parentSpanId="")]),
    _line([{k: v for k, v in _span().items() if k not in ("name", "parentSpanId", "attributes")}]),
    _line([_span(startTimeUnixNano=10, endTimeUnixNano=20)]),
    _line([_span(), _span(spanId="12" * 8)], schemaUrl="s"),
    _line([]),
    _line([_span()], scopeSpans=[{"spans": [_span()]}, {"scope": {}}, {"spans": []}]),
    _line([_span(traceId="q80AAAAAAAAAAAAAAAAAAA==", spanId="AAAAAAAAAAE=")]),  # base64 ids
]

# Lines it hands to the general parser: rows the generic path's, or refused by both
PARSED = [
    _PLAIN.replace(b'"traceId"', b'"trace\\u0049d"'),  # an escape in a key
    _line([_span(name="tab\there")]),  # an escape in a name
    _line([_span(name="\u00e9")]),
    _line([_span(status={"message": "\u00e9"})]),  # \u in a skipped value
    _PLAIN.replace(b",", b",\t", 1),  # a tab as whitespace
    _PLAIN + b"\r",
    _PLAIN.replace(b'"kind":1', b'"kind":1e5'),  # an exponent
    _line([_span(kind=123456789012345678)]),  # a long number
    _line([_span(name=None)]),
    _line([_span(parentSpanId=None)]),
    _line([_span()], scopeSpans=None),
    _PLAIN.replace(b'"spans":[', b'"spans":[],"spans":[', 1),  # a repeated field
    _PLAIN[:-3] + b',"resource":{}}]}',
    _PLAIN[:_SPAN_END] + b',"name":"again"' + _PLAIN[_SPAN_END:],  # in a span
    _PLAIN.replace(b'"resourceSpans":[', b'"resourceSpans":[],"resourceSpans":[', 1),
    _PLAIN + b"x",  # trailing bytes
    b"[" + _PLAIN + b"]",
    _line([_span(status={"d": _nested(70)})]),  # deeper than the scanner goes
    _PLAIN.replace(b'"kind":1', b'"kind":01'),  # invalid JSON from here on
    _PLAIN.replace(b'"kind":1', b'"kind":-'),
    _PLAIN.replace(b'"kind":1', b'"kind":1.'),
    _PLAIN.replace(b'"kind":1', b'"kind":tru'),
    _PLAIN.replace(b'"kind":1', b'"kind":"\\x"'),
    _PLAIN.replace(b'"kind":1', b'"kind":"a\x01b"'),  # a raw control character
    _PLAIN.replace(b'"stringValue":"x"', b'"stringValue":"a\x01b"'),  # ... in an attribute
    _PLAIN.replace(b'"kind":1', b'"kind":"\xff"'),  # not UTF-8
    _PLAIN.replace(b'"kind":1,', b'"kind":1,,'),
    _PLAIN.replace(b'"status":{}', b'"status":{"a"}'),
    _PLAIN.replace(b'"status":{}', b'"status":{"a":1,}'),
    _PLAIN.replace(b'"status":{}', b'"status":[1,]'),
    _PLAIN[:-1],
]


@needs_native
@pytest.mark.parametrize("line", SCANNED)
def test_the_scanner_reads_the_plain_layout_and_gives_the_generic_rows(line: bytes):
    rows, scanned = _scanned(line)
    assert scanned == 1, "left to the general parser"
    assert rows is not None and repr(rows) == repr(_generic(line))


@needs_native
@pytest.mark.parametrize("line", PARSED)
def test_the_scanner_leaves_other_lines_to_the_general_parser(line: bytes):
    rows, scanned = _scanned(line)
    assert scanned == 0, "the scanner took a line it must leave"
    generic = _generic(line)
    if generic is None:
        assert rows is None
    else:
        assert rows is None or repr(rows) == repr(generic)


@needs_native
def test_one_byte_changes_give_the_generic_rows_or_none():
    """Every one-byte change of a plain line (a structural or string byte put in, taken out,
    doubled): where the generic path refuses the line the native decoder leaves it, and
    where it reads it the rows are the same."""
    line = _line([_span(), _span(spanId="12" * 8, status={"message": "a\\"})])
    changes = [b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b" ", b"0", b"-", b"."]
    changes += [b"\x01", b""]
    decoder = otlp_native.NativeLineDecoder()
    took = refused = 0
    for at in range(len(line)):
        for change in changes + [line[at : at + 1] * 2]:
            changed = line[:at] + change + line[at + 1 :]
            rows = decoder.decode(changed, 0, len(changed))
            generic = _generic(changed)
            if generic is None:
                assert rows is None, changed
                refused += 1
            elif rows is not None:
                assert repr(rows) == repr(generic), changed
                took += 1
    assert took > 1000 and refused > 1000  # both sides are exercised


@needs_native
def test_lists_met_lately_are_taken_by_comparison_with_the_same_rows():
    """A list the scanner met among the last few is taken by comparing its bytes: the same
    list again is, one that begins like it but goes on (a longer list) or differs is not."""
    short = [_attr("tf_otel.rank", {"intValue": "1"})]
    longer = short + [_attr("gpu.utilization", {"doubleValue": 0.5})]
    other = [_attr("tf_otel.rank", {"intValue": "2"})]
    line = _line([_span(attributes=a) for a in (short, longer, short, other, longer, short)])
    decoder = otlp_native.NativeLineDecoder()
    rows = decoder.decode(line, 0, len(line))
    assert rows is not None and repr(rows) == repr(_generic(line))
    assert decoder.lists_recent == 3  # the second short and longer, the third short
    assert [row[9] for row in rows] == [1, 1, 1, 2, 1, 1]  # each span its own list's rank


# Attribute lists (one span's, the analysis reading rank, step, category, job, GPU and kept
# keys): the scanner reads the plain layout's (True); others go to the general parser (False)
_R, _G = "tf_otel.rank", "gpu.utilization"
LISTS = [
    ([_attr(_R, {"intValue": "5"})], True),
    ([_attr(_R, {"intValue": 5}), _attr(_G, {"doubleValue": 0.5})], True),
    ([_attr(_G, {"doubleValue": -0.0})], True),  # the sign kept (sonic-rs reads 0.0)
    ([_attr(_G, {"doubleValue": 3})], True),
    ([_attr("horovod.last_arrival", {"boolValue": False})], True),
    ([_attr("tf_otel.step", {"intValue": "1"}), _attr("tf_otel.step", {"intValue": "2"})], True),
    ([_attr("other", {"arrayValue": {"values": [{"intValue": 1}, None]}})], True),  # skipped
    ([_attr(_R, {"stringValue": "5"})], True),  # not its slot's type: the helper decides
    ([{"key": _R}], True),  # no value: the helper
    ([_attr(_R, {})], False),
    ([_attr(_R, None)], False),
    ([{"value": {"intValue": "5"}, "key": _R}], False),  # the key after its value
    ([{"key": _R, "value": {"intValue": "5"}, "x": 1}], False),  # an unknown field
    ([_attr(_R, {"intValue": "5", "stringValue": "5"})], False),  # two kinds
    ([_attr(_G, {"doubleValue": 1e300})], False),  # an exponent
    ([_attr(_G, {"doubleValue": "0.5"})], False),
    ([_attr(_G, {"boolValue": "true"})], False),
    ([_attr("tf_otel.job.id", {"stringValue": "a\tb"})], False),  # an escape in a string read
    ([_attr("tf_otel.job.id", {"bytesValue": "AA=="})], False),
    ([{"key": _R, "key2": 1}], False),
]


@needs_native
@pytest.mark.parametrize("attributes, scanned", LISTS)
def test_attribute_lists_the_scanner_reads_or_leaves_give_the_generic_rows(attributes, scanned):
    line = _line([_span(attributes=attributes)])
    decoder = otlp_native.NativeLineDecoder()
    rows = decoder.decode(line, 0, len(line))
    assert rows is not None and repr(rows) == repr(_generic(line))
    assert decoder.lists_scanned == int(scanned)
    spaced = json.dumps(json.loads(line)).encode()  # spaces after ',' and ':'
    assert repr(decoder.decode(spaced, 0, len(spaced))) == repr(rows)
