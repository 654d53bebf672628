"""`python -m tf_otel.cli analyze` end to end: outputs, and bad input -> exit 2, one line."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from analysis_builders import JobBuilder

REPO = Path(__file__).resolve().parents[2]


def analyze(*args: str):
    paths = [os.environ.get("PYTHONPATH", ""), str(REPO)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    return subprocess.run(
        [sys.executable, "-m", "tf_otel.cli", "analyze", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def straggler_job() -> JobBuilder:
    job = JobBuilder("job-42", world_size=2)
    for number in range(6):
        step = job.step(number)
        base = number * 200
        delay = 25.0 if number in (2, 4) else 0.0
        for rank in (0, 1):
            late = delay if rank == 1 else 0.0
            step.rank(rank, base, base + 100 + delay)
            step.span(rank, "input", "next", base, base + 10)
            step.span(rank, "compute", "fwd", base + 10, base + 60 + late)
            step.collective(
                rank, f"g{number}", base + 60 + late, base + 90 + delay, wait_end=base + 80 + delay
            )
            step.span(rank, "compute", "apply", base + 90 + delay, base + 100 + delay)
    return job


@pytest.fixture()
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "traces.jsonl"
    straggler_job().write_otlp(path)
    return path


def test_json_names_the_straggler_steps(trace_file: Path, tmp_path: Path):
    html_path = tmp_path / "report.html"
    done = analyze(str(trace_file), "--format", "json", "--html", str(html_path))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["schema_version"] == 2
    assert report["job_id"] == "job-42"
    stragglers = {s["step"]: s["straggler"] for s in report["steps"] if s["straggler"]}
    assert sorted(stragglers) == [2, 4]
    assert all(s["rank"] == 1 and s["excess_ms"] == 25.0 for s in stragglers.values())
    assert report["outliers"]["steps"] == [2, 4]
    assert report["summary"]["what_if_saving_ms"] == 50.0
    rank1 = next(r for r in report["ranks"] if r["rank"] == 1)
    assert rank1["straggler_steps"] == [2, 4]
    page = html_path.read_text()
    assert page.count("<svg") == 1 + 6  # the overview's step-time plot, one swimlane per step
    assert page.index("id='overview'") < page.index("id='steps'")
    assert 'class="critical"' in page


def test_table_and_selection(trace_file: Path):
    done = analyze(str(trace_file), "--steps", "3:5")
    assert done.returncode == 0, done.stderr
    assert "3 steps" in done.stdout.splitlines()[0]
    assert "r1 +25.000" in done.stdout  # step 4's straggler


def test_directory_gzip_and_pretty_printed_file(tmp_path: Path):
    job = straggler_job()
    lines = job.otlp_lines()
    (tmp_path / "rank0.json").write_text(json.dumps(lines[0], indent=2))  # one whole document
    with gzip.open(tmp_path / "rank1.jsonl.gz", "wt") as handle:
        handle.write(json.dumps(lines[1]) + "\n")
    (tmp_path / "notes.txt").write_text("not a trace, not read")
    done = analyze(str(tmp_path), "--format", "json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["steps"]) == 6


BAD_FILES = {
    "picture.png": (b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "PNG"),
    "chrome.json": (json.dumps({"traceEvents": [{"ph": "X", "ts": 1}]}).encode(), "Chrome"),
    "empty.jsonl": (b"", "empty"),
    "other.json": (json.dumps({"hello": "world"}).encode(), "not OTLP-JSON"),
    "garbage.jsonl": (b"this is not json at all\n", "not valid JSON"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_files_give_one_clear_error(tmp_path: Path, name: str):
    content, expected = BAD_FILES[name]
    path = tmp_path / name
    path.write_bytes(content)
    done = analyze(str(path))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert str(path) in done.stderr and expected in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_truncated_last_line_names_file_and_line_with_strict(tmp_path: Path):
    text = "".join(json.dumps(line) + "\n" for line in straggler_job().otlp_lines())
    path = tmp_path / "cut.jsonl"
    path.write_text(text[: len(text) - 200])
    done = analyze(str(path), "--strict")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{path}: line 2 is not valid JSON" in done.stderr
    # without --strict: skipped, said with its offset, the rest analysed (rank 0's record)
    done = analyze(str(path))
    assert done.returncode == 0, done.stderr
    offset = len(json.dumps(straggler_job().otlp_lines()[0])) + 1
    assert f"{path}: byte {offset:,}: skipped its last record, cut short" in done.stderr


def test_malformed_span_and_missing_path(tmp_path: Path):
    line = straggler_job().otlp_lines()[0]
    del line["resourceSpans"][0]["scopeSpans"][0]["spans"][3]["startTimeUnixNano"]
    path = tmp_path / "bad_span.jsonl"
    path.write_text(json.dumps(line) + "\n")
    done = analyze(str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert str(path) in done.stderr and "startTimeUnixNano" in done.stderr
    done = analyze(str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "no such file" in done.stderr


def test_two_jobs_need_a_choice(tmp_path: Path):
    straggler_job().write_otlp(tmp_path / "a.jsonl")
    other = JobBuilder("job-7", world_size=1)
    step = other.step(0)
    step.rank(0, 0, 10)
    other.write_otlp(tmp_path / "b.jsonl")
    done = analyze(str(tmp_path))
    assert done.returncode == 2 and "--job" in done.stderr and "job-7" in done.stderr
    done = analyze(str(tmp_path), "--job", "job-7", "--format", "json")
    assert done.returncode == 0 and json.loads(done.stdout)["summary"]["steps"] == 1


def test_png_export_writes_one_picture_per_step(trace_file: Path, tmp_path: Path):
    done = analyze(str(trace_file), "--png", str(tmp_path / "png"))
    assert done.returncode == 0, done.stderr
    written = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert written == [f"step_{n}.png" for n in range(6)]
    assert all((tmp_path / "png" / n).read_bytes()[:4] == b"\x89PNG" for n in written)


def test_png_without_matplotlib_is_a_clear_message(trace_file: Path, tmp_path: Path, monkeypatch):
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('matplotlib hidden for this test')\n")
    monkeypatch.setenv("PYTHONPATH", str(shim.parent))
    done = analyze(str(trace_file), "--png", str(tmp_path / "png"))
    assert done.returncode == 2 and "matplotlib" in done.stderr
    assert "Traceback" not in done.stderr


def test_jaeger_ui_download_file_reads_like_otlp(trace_file: Path, tmp_path: Path):
    download = tmp_path / "jaeger-download.json"
    download.write_text(json.dumps({"data": straggler_job().jaeger_traces()}))
    from_jaeger = analyze(str(download), "--format", "json")
    from_otlp = analyze(str(trace_file), "--format", "json")
    assert from_jaeger.returncode == 0, from_jaeger.stderr
    first, second = json.loads(from_jaeger.stdout), json.loads(from_otlp.stdout)
    first.pop("source"), second.pop("source")
    assert first == second


def test_time_window_and_bad_ranges(trace_file: Path):
    from analysis_builders import EPOCH_NS

    since = (EPOCH_NS + 350 * 1_000_000) / 1e9  # steps start every 200 ms: keeps 2..5
    done = analyze(str(trace_file), "--since", repr(since), "--format", "json")
    assert [s["step"] for s in json.loads(done.stdout)["steps"]] == [2, 3, 4, 5]
    for args, message in (
        (["--steps", "x:y"], "bad step range"),
        (["--since", "yesterday"], "bad time"),
        (["--steps", "100:"], "no steps in the selected range"),
    ):
        done = analyze(str(trace_file), *args)
        assert done.returncode == 2 and message in done.stderr, done.stderr
