"""The OTLP-JSON loader's fast paths: parallel file reading and the attributes it keeps."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_analysis_cli import straggler_job

from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.load import files
from tf_otel.analysis.load.files import load_file, load_paths, worker_count
from tf_otel.analysis.load.otlp import decode_traces_data
from tf_otel.analysis.model import Span


def _write_ranks(directory: Path) -> None:
    """One file per rank, as TF_OTEL_FILE writes them."""
    for number, line in enumerate(straggler_job().otlp_lines()):
        (directory / f"rank{number}.jsonl").write_text(json.dumps(line) + "\n")


def test_parallel_load_equals_sequential_load(tmp_path: Path):
    _write_ranks(tmp_path)
    assert worker_count(sorted(tmp_path.iterdir()), 2) == 2
    one = [s.to_row() for s in load_paths([str(tmp_path)], progress=False, workers=1)]
    two = [s.to_row() for s in load_paths([str(tmp_path)], progress=False, workers=2)]
    assert len(one) > 20 and one == two
    assert {row[9] for row in one} == {0, 1}  # ranks, from the resource


def test_parallel_load_names_the_bad_file(tmp_path: Path):
    _write_ranks(tmp_path)
    bad = tmp_path / "rank1.jsonl"
    bad.write_text(bad.read_text()[:-200])
    with pytest.raises(AnalysisError, match="rank1.jsonl: line 1 is not valid JSON"):
        load_paths([str(tmp_path)], progress=False, workers=2)


def test_row_round_trip_keeps_every_field():
    span = Span("a" * 32, "b" * 16, "c" * 16, "op", 5, 3, {"gpu.utilization": 0.5}, {"r": 1})
    copy = Span.from_row(span.to_row())
    assert copy.to_row() == span.to_row() and copy.end_ns == 5  # end clamped to start


def _document(attributes):
    span = {
        "traceId": "AB" * 16,
        "spanId": "cd" * 8,
        "parentSpanId": "ef" * 8,
        "name": "allreduce",
        "startTimeUnixNano": "10",
        "endTimeUnixNano": "20",
        "attributes": attributes,
    }
    resource = {"attributes": [{"key": "tf_otel.rank", "value": {"intValue": "3"}}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [span]}]}]}


def test_kept_attributes_are_the_ones_the_analysis_reads():
    attributes = [
        {"key": "tf_otel.category", "value": {"stringValue": "collective"}},
        {"key": "tf_otel.step", "value": {"intValue": "7"}},
        {"key": "tf_otel.collective.key", "value": {"stringValue": "s7/g0"}},
        {"key": "horovod.last_arrival", "value": {"boolValue": True}},
        {"key": "horovod.wait_ns", "value": {"intValue": "5"}},
        {"key": "gpu.utilization", "value": {"doubleValue": 0.25}},
        {"key": "tensorflow.op.type", "value": {"stringValue": "HorovodAllreduce"}},
    ]
    (span,) = decode_traces_data(_document(attributes), "x")
    assert span.trace_id == "ab" * 16 and span.parent_id == "ef" * 8
    assert (span.category, span.rank, span.step, span.gpu_utilization) == ("collective", 3, 7, 0.25)
    assert span.attributes == {
        "tf_otel.collective.key": "s7/g0",
        "horovod.last_arrival": True,
        "horovod.wait_ns": 5,
    }


def test_rank_and_step_conversions_match_the_span_constructor():
    for rank, step in (({"stringValue": "2"}, {"stringValue": "x"}), ({"boolValue": True}, None)):
        attributes = [{"key": "tf_otel.rank", "value": rank}]
        if step is not None:
            attributes.append({"key": "tf_otel.step", "value": step})
        (fast,) = decode_traces_data(_document(attributes), "x")
        slow = Span(
            "a" * 32,
            "b" * 16,
            None,
            "n",
            0,
            1,
            {
                "tf_otel.rank": next(iter(rank.values())),
                **({"tf_otel.step": next(iter(step.values()))} if step else {}),
            },
            {"tf_otel.rank": 3},
        )
        assert (fast.rank, fast.step) == (slow.rank, slow.step)
    assert fast.rank is None  # a boolean rank is no rank (and does not fall back to the resource)


def test_bad_kept_attribute_value_is_an_error_naming_the_input(tmp_path: Path):
    attributes = [{"key": "tf_otel.step", "value": {"intValue": "seven"}}]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_document(attributes)) + "\n")
    with pytest.raises(AnalysisError, match="bad.jsonl line 1: malformed OTLP-JSON span"):
        load_file(path)


def _die(path):
    os._exit(3)  # a worker killed (e.g. by the OOM killer)


def test_dead_worker_is_one_clear_error(tmp_path: Path, monkeypatch):
    _write_ranks(tmp_path)
    monkeypatch.setattr(files, "_load_rows", _die)
    with pytest.raises(AnalysisError, match="worker process died.*TF_OTEL_ANALYZE_WORKERS=1"):
        load_paths([str(tmp_path)], progress=False, workers=2)


def _one_big_file(directory: Path, copies: int = 20) -> Path:
    """Every rank's lines in one file, as the Collector's file exporter writes one file."""
    lines = [json.dumps(line) for line in straggler_job().otlp_lines()] * copies
    path = directory / "collector.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_big_file_is_read_in_parts_with_the_same_result(tmp_path: Path, monkeypatch):
    path = _one_big_file(tmp_path)
    monkeypatch.setattr(files, "PART_MIN_BYTES", 1000)
    parts = files.plan_parts([path], 2)
    assert len(parts) == 16 and parts[0][1] == 0 and parts[-1][2] == path.stat().st_size
    assert all(a[2] == b[1] for a, b in zip(parts, parts[1:]))  # contiguous, no gaps
    data = path.read_bytes()
    assert all(data[start - 1 : start] == b"\n" for _, start, _ in parts[1:])  # line starts
    one = [s.to_row() for s in load_paths([str(path)], progress=False, workers=1)]
    two = [s.to_row() for s in load_paths([str(path)], progress=False, workers=2)]
    assert worker_count([path], 2) == 2 and len(one) > 100 and one == two


def test_corrupt_line_in_a_later_part_is_named_by_its_line_in_the_file(tmp_path: Path, monkeypatch):
    path = _one_big_file(tmp_path)
    lines = path.read_text().splitlines()
    lines[30] = lines[30][:-50]  # truncated line 31, far from the first part
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(files, "PART_MIN_BYTES", 1000)
    assert files.plan_parts([path], 2)[0][2] < sum(len(line) + 1 for line in lines[:30])
    with pytest.raises(AnalysisError, match=r"collector.jsonl: line 31 is not valid JSON"):
        load_paths([str(path)], progress=False, workers=2)


def test_pretty_printed_document_is_not_cut(tmp_path: Path, monkeypatch):
    path = tmp_path / "pretty.json"
    document = {"resourceSpans": []}
    for line in straggler_job().otlp_lines() * 10:
        document["resourceSpans"].extend(line["resourceSpans"])
    path.write_text(json.dumps(document, indent=2))
    monkeypatch.setattr(files, "PART_MIN_BYTES", 1000)
    assert files.plan_parts([path], 2) == [(path, 0, -1)]
    assert len(load_paths([str(path)], progress=False, workers=2)) > 100


def test_directory_passes_over_files_with_no_spans_naming_them(tmp_path: Path, capsys):
    """A ps task's TF_OTEL_FILE is empty (it runs no steps): the job's folder still analyses."""
    _write_ranks(tmp_path)
    with_ps = [s.to_row() for s in load_paths([str(tmp_path)], progress=False, workers=1)]
    (tmp_path / "ps.jsonl").write_text("")
    (tmp_path / "ps1.jsonl").write_text("\n \n")
    rows = [s.to_row() for s in load_paths([str(tmp_path)], progress=False, workers=1)]
    assert rows == with_ps
    err = capsys.readouterr().err
    assert "passing over 2 file(s) with no spans" in err and "ps.jsonl, ps1.jsonl" in err
    assert err.count("\n") == 1  # one line


def test_empty_file_named_alone_and_a_folder_of_empty_files_are_errors(tmp_path: Path):
    empty = tmp_path / "ps.jsonl"
    empty.write_text("")
    with pytest.raises(AnalysisError, match="ps.jsonl: empty file"):
        load_paths([str(empty)], progress=False, workers=1)
    with pytest.raises(AnalysisError, match="every trace file in it is empty"):
        load_paths([str(tmp_path)], progress=False, workers=1)
