"""Post-mortem on what a job left (issue 44): a record cut short by a kill, a corrupt line, a
rank whose spans stop early. Every line that is JSON is analysed and exit 0; what was skipped is
said once on stderr (the file, the byte offset, what was lost) and in the report's warnings;
``--strict`` keeps exit 2. The same on every decoder path (generic, msgspec, native) and in
memory or spilled."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from analysis_builders import JobBuilder
from load_switches import choose
from test_analysis_cli import analyze

from tf_otel.analysis.analyze import analyze_source
from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.load import files
from tf_otel.analysis.load.decoders import DECODERS
from tf_otel.analysis.load.files import load_paths
from tf_otel.analysis.load.spill import load_spilled


def _job(steps: int = 8, ranks: int = 2, last: Optional[Dict[int, int]] = None) -> JobBuilder:
    """A job of ``steps`` steps; rank r's spans end at step ``last[r]`` where given."""
    last = last or {}
    job = JobBuilder("job-pm", world_size=ranks)
    for number in range(steps):
        step = job.step(number)
        base = number * 200
        for rank in range(ranks):
            if number > last.get(rank, steps):
                continue
            step.rank(rank, base, base + 100)
            step.span(rank, "compute", "fwd", base + 10, base + 90)
    return job


def _records(job: JobBuilder) -> Dict[int, List[Dict[str, Any]]]:
    """Each rank's spans as one record (line) a step, as TF_OTEL_FILE writes them in batches."""
    by_rank: Dict[int, List[Dict[str, Any]]] = {}
    for rank, line in enumerate(job.otlp_lines()):
        resource = line["resourceSpans"][0]
        by_step: Dict[int, List[Any]] = {}
        for span in resource["scopeSpans"][0]["spans"]:
            step = next(
                a["value"]["intValue"] for a in span["attributes"] if a["key"].endswith("step")
            )
            by_step.setdefault(int(step), []).append(span)
        by_rank[rank] = [
            {
                "resourceSpans": [
                    {
                        "resource": resource["resource"],
                        "scopeSpans": [{"scope": {"name": "tf_otel"}, "spans": spans}],
                    }
                ]
            }
            for _, spans in sorted(by_step.items())
        ]
    return by_rank


def _write(directory: Path, job: JobBuilder) -> Dict[int, Path]:
    paths = {}
    for rank, records in _records(job).items():
        paths[rank] = directory / f"rank{rank}.jsonl"
        paths[rank].write_text(
            "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        )
    return paths


def _cut_last_record(path: Path) -> int:
    """Cut the file's last record in half (no newline after it); where it begins."""
    data = path.read_bytes()
    begin = data.rstrip(b"\n").rfind(b"\n") + 1
    path.write_bytes(data[: begin + (len(data) - begin) // 2])
    return begin


def test_a_record_cut_in_half_is_skipped_named_and_the_rest_analysed(tmp_path: Path) -> None:
    paths = _write(tmp_path, _job())
    begin = _cut_last_record(paths[1])  # rank 1's step 7, cut short by a kill
    done = analyze(str(tmp_path), "--format", "json")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "skipped" in line]
    assert len(lines) == 1, done.stderr
    assert str(paths[1]) in lines[0] and f"byte {begin:,}" in lines[0]
    assert "its last record, cut short" in lines[0] and "span(s) begun in it, lost" in lines[0]
    report = json.loads(done.stdout)
    assert len(report["steps"]) == 8  # every step; the last without rank 1
    assert any(f"byte {begin:,}" in warning for warning in report["warnings"])
    assert "rank 1's spans end at step 6 (the others ran to 7)" in " ".join(report["warnings"])


def _gzip_cut_short(path: Path) -> Tuple[Path, int]:
    """The file gzipped, then cut short mid-stream as a kill leaves it: the .gz, and where its
    last record (cut short too) begins in the uncompressed bytes."""
    plain = path.read_bytes()
    packed = gzip.compress(plain)
    cut = packed[: len(packed) * 3 // 4]
    gz = path.with_name(path.name + ".gz")
    gz.write_bytes(cut)
    path.unlink()
    kept = zlib.decompressobj(wbits=31).decompress(cut)
    assert kept and plain.startswith(kept) and not kept.endswith(b"\n")
    return gz, kept.rfind(b"\n") + 1


def test_a_gzip_file_cut_short_is_skipped_named_and_the_rest_analysed(
    tmp_path: Path, capsys
) -> None:
    paths = _write(tmp_path, _job())
    gz, begin = _gzip_cut_short(paths[1])
    done = analyze(str(tmp_path), "--format", "json")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "skipped" in line]
    assert len(lines) == 1, done.stderr
    assert f"{gz}: byte {begin:,} (uncompressed): skipped its last record, cut short" in lines[0]
    report = json.loads(done.stdout)
    assert len(report["steps"]) == 8  # rank 0's whole file, rank 1's records before the cut
    assert any("rank 1's spans end at step" in w for w in report["warnings"]), report
    strict = analyze(str(tmp_path), "--strict")
    assert strict.returncode == 2 and str(gz) in strict.stderr and "Traceback" not in strict.stderr
    # in memory and spilled (where gzip.open's stream fails and the file is read again) alike
    (rows, err, steps), spilled = (_loaded(tmp_path, s, 2, capsys) for s in (False, True))
    assert (rows, err, steps) == spilled and steps == 8 and err.count("skipped") == 1, err


def test_a_gzip_file_of_several_members_keeps_those_before_the_cut(tmp_path: Path) -> None:
    """A writer that starts a gzip member a flush, killed in the third: the first two are read
    whole, the third as far as it goes; strict, the file is an error."""
    data = _write(tmp_path, _job())[1].read_bytes()
    lines = data.splitlines(keepends=True)
    members = [b"".join(lines[:3]), b"".join(lines[3:5]), b"".join(lines[5:])]
    packed = [gzip.compress(m) for m in members]
    gz = tmp_path / "rank1.jsonl.gz"
    gz.write_bytes(packed[0] + packed[1] + packed[2][: len(packed[2]) // 2])
    kept = files.read_trace_bytes(gz, lenient=True)
    assert data.startswith(kept) and len(members[0] + members[1]) < len(kept) < len(data)
    with pytest.raises(AnalysisError, match="rank1.jsonl.gz: cannot read"):
        files.read_trace_bytes(gz)
    whole = tmp_path / "whole.jsonl.gz"
    whole.write_bytes(b"".join(packed))
    assert files.read_trace_bytes(whole, lenient=True) == data


def _warnings_of(folder: Path) -> List[str]:
    spans = load_paths([str(folder)], progress=False, workers=1, strict=False)
    return analyze_source(spans, str(folder)).warnings


def test_rank0_gone_its_rootless_steps_are_the_same_series(tmp_path: Path) -> None:
    """Rank 0 writes the roots, which name the step function ("tf_function:train_step step
    4"); once it is killed the steps have no root: they are still train_step's steps, so rank 0
    is said once to have stopped, not missing from a second, nameless series' steps."""
    job = _job(steps=8, ranks=3, last={0: 4})
    for step in job.steps:
        step.root_name = f"tf_function:train_step step {step.step}"
        step.with_root = step.step <= 4
    _write(tmp_path, job)
    report = _warnings_of(tmp_path)
    said = [w for w in report if "spans end at step" in w]
    assert said == ["rank 0's spans end at step 4 (the others ran to 7): it stopped or was killed"]
    assert not any("no spans from ranks" in w for w in report), report
    # control: with a second named step function the rootless steps stay unnamed
    job.steps[0].root_name = "tf_function:eval_step step 0"
    _write(tmp_path, job)
    report = _warnings_of(tmp_path)
    assert not any("spans end at step" in w for w in report), report


def test_strict_keeps_exit_2_naming_the_file_and_line(tmp_path: Path) -> None:
    paths = _write(tmp_path, _job())
    _cut_last_record(paths[1])
    done = analyze(str(tmp_path), "--strict")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{paths[1]}: line 8 is not valid JSON" in done.stderr


def test_a_short_jobs_one_record_cut_short_costs_that_rank_only(tmp_path: Path) -> None:
    """A short job writes one record a file: cut short, the rank's whole run is lost, the other
    ranks' are analysed."""
    job = _job(steps=4)
    for rank, line in enumerate(job.otlp_lines()):
        text = json.dumps(line)
        cut = text if rank == 0 else text[: len(text) // 2]
        (tmp_path / f"rank{rank}.jsonl").write_text(cut + ("\n" if rank == 0 else ""))
    done = analyze(str(tmp_path), "--format", "json")
    assert done.returncode == 0, done.stderr
    assert f"{tmp_path / 'rank1.jsonl'}: byte 0: skipped its last record" in done.stderr
    report = json.loads(done.stdout)
    assert len(report["steps"]) == 4


def test_a_corrupt_line_in_the_middle_is_skipped(tmp_path: Path) -> None:
    paths = _write(tmp_path, _job())
    lines = paths[0].read_bytes().split(b"\n")
    begin = sum(len(line) + 1 for line in lines[:3])
    lines[3] = lines[3][:40] + b"\x00garbage" + lines[3][60:]
    paths[0].write_bytes(b"\n".join(lines))
    done = analyze(str(tmp_path), "--format", "json")
    assert done.returncode == 0, done.stderr
    assert f"{paths[0]}: byte {begin:,}: skipped a line that is not valid JSON" in done.stderr
    report = json.loads(done.stdout)
    assert len(report["steps"]) == 8
    assert any("step 3: no spans from ranks [0]" in w for w in report["warnings"])


def test_a_garbage_file_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.jsonl"
    path.write_bytes(b"this is not json at all\n")
    done = analyze(str(path))
    assert done.returncode == 2 and "not valid JSON" in done.stderr


def _loaded(tmp_path: Path, spilled: bool, workers: int, capsys) -> tuple:
    if spilled:
        with load_spilled([str(tmp_path)], progress=False, workers=workers, strict=False) as source:
            result = analyze_source(source, str(tmp_path))
            rows = sorted(s.to_row() for t in source.trace_ids() for s in source.spans(t))
    else:
        spans = load_paths([str(tmp_path)], progress=False, workers=workers, strict=False)
        result = analyze_source(spans, str(tmp_path))
        rows = sorted(s.to_row() for s in spans)
    return rows, capsys.readouterr().err, len(result.steps)


@pytest.mark.parametrize("decoder", DECODERS)
def test_every_decoder_path_skips_alike(tmp_path: Path, monkeypatch, capsys, decoder) -> None:
    choose(decoder, monkeypatch)
    paths = _write(tmp_path, _job())
    _cut_last_record(paths[1])
    lines = paths[0].read_bytes().split(b"\n")
    lines[2] = lines[2][:50]  # and a line cut short in the middle
    paths[0].write_bytes(b"\n".join(lines))
    found = [_loaded(tmp_path, spilled, 1, capsys) for spilled in (False, True)]
    (rows, err, steps), (spilled_rows, spilled_err, spilled_steps) = found
    assert rows == spilled_rows and err == spilled_err and steps == spilled_steps == 8
    assert err.count("skipped") == 2, err


def test_later_parts_and_workers_skip_alike(tmp_path: Path, monkeypatch, capsys) -> None:
    """A big file read in parts by workers: the skip is said with the offset in the file."""
    job = _job(steps=60)
    paths = _write(tmp_path, job)
    begin = _cut_last_record(paths[1])
    lines = paths[0].read_bytes().split(b"\n")
    middle = sum(len(line) + 1 for line in lines[:40])
    lines[40] = lines[40][:30]
    paths[0].write_bytes(b"\n".join(lines))
    monkeypatch.setattr(files, "PART_MIN_BYTES", 2000)
    assert len(files.plan_parts([paths[0]], 2)) > 2
    one = _loaded(tmp_path, False, 1, capsys)
    two = _loaded(tmp_path, False, 2, capsys)
    spilled = _loaded(tmp_path, True, 2, capsys)
    assert one == two == spilled
    assert f"byte {begin:,}" in one[1] and f"byte {middle:,}" in one[1]


def test_strict_library_loading_raises(tmp_path: Path) -> None:
    paths = _write(tmp_path, _job())
    _cut_last_record(paths[1])
    with pytest.raises(AnalysisError, match="rank1.jsonl: line 8 is not valid JSON"):
        load_paths([str(tmp_path)], progress=False, workers=1)
    with pytest.raises(AnalysisError, match="rank1.jsonl: line 8 is not valid JSON"):
        load_spilled([str(tmp_path)], progress=False, workers=1)


def test_many_bad_lines_are_said_in_a_few(tmp_path: Path, capsys) -> None:
    paths = _write(tmp_path, _job(steps=12))
    lines = paths[0].read_bytes().split(b"\n")
    for n in range(1, 9):
        lines[n] = lines[n][:20]
    paths[0].write_bytes(b"\n".join(lines))
    load_paths([str(tmp_path)], progress=False, workers=1, strict=False)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == files.SKIP_NOTES_PER_FILE + 1
    assert "5 more line(s) skipped" in err[-1]


# -- a rank whose spans stop early ------------------------------------------------------------


def test_a_stopped_rank_is_said_once(tmp_path: Path) -> None:
    """Rank 1 killed after step 39 of 60: one line, not 20 "no spans from ranks [1]"."""
    job = _job(steps=60, ranks=3, last={1: 39})
    job.write_otlp(tmp_path / "spans.jsonl")
    done = analyze(str(tmp_path), "--format", "json")
    assert done.returncode == 0, done.stderr
    warnings = json.loads(done.stdout)["warnings"]
    said = [w for w in warnings if "rank 1" in w or "[1]" in w]
    assert said == [
        "rank 1's spans end at step 39 (the others ran to 59): it stopped or was killed"
    ], warnings


def test_a_rank_missing_in_the_middle_is_still_said_per_step() -> None:
    job = _job(steps=10, ranks=2)
    job.steps[4].spans = [s for s in job.steps[4].spans if s.rank != 1]
    job.steps[4].step_spans.pop(1)
    from analysis_builders import decoded_spans

    result = analyze_source(decoded_spans(job), "job")
    assert "step 4: no spans from ranks [1]" in result.warnings
    assert not any("stopped" in w for w in result.warnings)
