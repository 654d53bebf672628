"""The native decoder writes a block's spill pieces itself (``NativeLineDecoder.spill_block``): what
``marshal.loads`` reads of them is what the Python path writes (``spill._write`` of the block's
rows), piece by piece; a block it cannot read whole is handed back (None), and the analysis
reports the same either way."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from load_switches import choose  # noqa: E402
from spill_pieces import native_pieces, python_pieces  # noqa: E402
from test_analysis_load_msgspec import _attr, _line, _span  # noqa: E402
from test_analysis_skeleton import CHANGES, _report, _write  # noqa: E402

from tf_otel.analysis.load import files, otlp_native, spill  # noqa: E402
from tf_otel.analysis.skeleton import SKELETON_SETS  # noqa: E402

needs_native = pytest.mark.skipif(
    not otlp_native.AVAILABLE,
    reason="no Rust toolchain here (test_the_native_decoder_is_built_wherever_rust_is)",
)


def _python_pieces(data: bytes, stop: int) -> Any:
    """The Python path's pieces of ``data[:stop]``."""
    return python_pieces(files.decode_line_block(Path("t"), data, stop))


def _native_pieces(data: bytes, stop: int) -> Any:
    spilled = otlp_native.NativeLineDecoder().spill_block(data, stop, SKELETON_SETS)
    return None if spilled is None else native_pieces(spilled)


def _same(data: bytes, stop: int = -1) -> None:
    stop = len(data) if stop < 0 else stop
    native = _native_pieces(data, stop)
    assert native is not None, "the block was handed back"
    expected = _python_pieces(data, stop)
    assert repr(native) == repr(expected)  # repr: NaN != NaN


@needs_native
@pytest.mark.parametrize("case", sorted(CHANGES))
def test_native_pieces_are_the_python_pieces(case: str, tmp_path: Path) -> None:
    """Each kind of trace of the skeleton tests (unranked spans, GPU values, stalls and jobs
    first, PS transfers, ...), two ranks' lines interleaved in each file."""
    directory = _write(tmp_path, CHANGES[case], files_of=2)
    paths = sorted(directory.glob("*.jsonl"))
    assert paths
    for path in paths:
        data = path.read_bytes()
        _same(data)
        _same(data, data.index(b"\n", len(data) // 2) + 1)  # a block that ends early


def _category(category: str, number: int) -> Any:
    attributes = [_attr("tf_otel.category", {"stringValue": category})]
    return _span(spanId=f"{number:016x}", attributes=attributes)


PLAIN = _line([_span(), _span(spanId="12" * 8, traceId="cd" * 16)])

BLOCKS = [
    PLAIN + b"\n\n   \n" + PLAIN + b"\n \t\x0b\x0c\n",  # blank lines skipped
    PLAIN + b"   \n" + PLAIN,  # spaces after a line, no newline at the end
    _line([_span(name="tab\there")]) + b"\n" + PLAIN,  # a line the scanner leaves
    b"\t" + PLAIN + b"\n" + PLAIN,  # ... the general parser reads
    _line([_span(attributes=[_attr("tf_otel.job.id", {"arrayValue": {"values": []}})])] * 3),
    _line([_span(attributes=[_attr("tf_otel.rank", {"stringValue": "5"})])] * 2),
    _line([_span(attributes=[_attr("gpu.utilization", {"doubleValue": 0.5})])]),
    _line([_span(attributes=[_attr("gpu.utilization", {"intValue": "7"})])]),
    _line([_span(attributes=[])], resource={"attributes": [_attr("x", {"stringValue": "y"})]}),
    _line([_span(traceId="q80AAAAAAAAAAAAAAAAAAA==", spanId="AAAAAAAAAAE=")]),  # base64 ids
    _line([_span(startTimeUnixNano=-5, endTimeUnixNano=2**62)]),
    # times of every marshalled size: 1 to 5 digits of 15 bits, either sign
    _line([_span(startTimeUnixNano=-(2**62) - 1, endTimeUnixNano=2**62 + 1)]),
    _line([_span(startTimeUnixNano=-(2**40) - 7, endTimeUnixNano=2**31)]),
    _line([_span(startTimeUnixNano=-(2**31) - 1, endTimeUnixNano=2**45 + 3)]),
    _line([_span(name="\u00e9\u4e2d")]),  # not ASCII
    _line([_span(traceId="ab" * 16, spanId=f"{n:016x}") for n in range(300)]),  # > 255 rows
    # a rank's first spans a stall and a job: its timeline begins with the op after them
    _line([_category("stall", 1), _category("job", 2), _category("compute", 3), _category("x", 4)]),
]


@needs_native
@pytest.mark.parametrize("block", BLOCKS)
def test_unusual_blocks_give_the_python_pieces(block: bytes) -> None:
    _same(block)


HANDED_BACK = [
    PLAIN + b"\r\n" + PLAIN,  # splitlines' line ends: the Python path
    PLAIN + b"\n" + PLAIN[:-2],  # a truncated line (the Python path names it)
    PLAIN + b"\n" + PLAIN.replace(b'"name":"allreduce"', b'"name":"\xff"'),  # not UTF-8
    PLAIN + b"\n[]",
    _line([_span(startTimeUnixNano="+10")]),  # a time the Python path reads differently
]


@needs_native
@pytest.mark.parametrize("block", HANDED_BACK)
def test_blocks_it_cannot_read_whole_are_handed_back(block: bytes) -> None:
    assert _native_pieces(block, len(block)) is None


@needs_native
def test_only_the_block_before_stop_is_read() -> None:
    block = PLAIN + b"\n" + b"garbage after the stop"
    _same(block, len(PLAIN) + 1)
    with pytest.raises(Exception, match="bad block end"):
        otlp_native.NativeLineDecoder().spill_block(block, len(block) + 1, SKELETON_SETS)


@needs_native
@pytest.mark.parametrize("case", ["plain", "unranked", "gpu_elsewhere", "ps_transfers"])
def test_reports_are_the_same_with_the_native_spill(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spill, "BLOCK_BYTES", 50_000)  # many pieces a trace
    directory = _write(tmp_path, CHANGES[case], files_of=2)
    reports: List[str] = []
    for decoder in ("native", "reference"):  # the native spill against the reference
        choose(decoder, monkeypatch)
        reports.append(_report(directory, True, monkeypatch))
    assert reports[0] == reports[1]
    assert json.loads(reports[0])[0]["steps"]  # something was analysed
