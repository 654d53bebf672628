"""The analysis keeps a job's attempts apart (issue 44, point 2): spans whose resource names
``tf_otel.job.attempt`` belong to the job ``<job id>@<attempt>`` on every decoder path; an input
with several attempts of one job asks for one, the job id alone takes its only attempt, and the
report names the attempts left out. ``tf-otel export`` chooses alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest
from analysis_builders import JobBuilder
from load_switches import choose
from test_analysis_cli import analyze

from tf_otel.analysis.load import spill
from tf_otel.analysis.load.decoders import DECODERS
from tf_otel.analysis.load.files import load_paths
from tf_otel.analysis.model import base_job, job_of
from tf_otel.cli import main as tf_otel_main


class AttemptJob(JobBuilder):
    """A job whose resource names its attempt, as tf_otel's does."""

    def __init__(self, attempt: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.attempt = attempt

    def resource(self, rank: int) -> Dict[str, Any]:
        return {**super().resource(rank), "tf_otel.job.attempt": self.attempt}


def _job(attempt: str, offset: float = 0.0) -> AttemptJob:
    job = AttemptJob(attempt, job_id="job-44", world_size=2)
    job.job_id = f"job-44/{attempt}"  # another attempt: other trace ids (the builder's hashes)
    for number in range(4):
        step = job.step(number)
        base = offset + number * 200
        for rank in (0, 1):
            step.rank(rank, base, base + 100)
            step.span(rank, "compute", "fwd", base + 10, base + 90)
    return job


def _folder(tmp_path: Path, *attempts: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    for n, attempt in enumerate(attempts):
        job = _job(attempt, offset=n * 10_000)
        lines = job.otlp_lines()
        for line in lines:  # the job id as tf_otel writes it: the same in every attempt
            for item in line["resourceSpans"][0]["resource"]["attributes"]:
                if item["key"] == "tf_otel.job.id":
                    item["value"] = {"stringValue": "job-44"}
        path = tmp_path / f"attempt-{attempt}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return tmp_path


def test_job_of_and_back() -> None:
    assert job_of({"tf_otel.job.attempt": "1"}, "j") == "j@1" and base_job("j@1") == "j"
    assert job_of({}, "j") == "j" == base_job("j") and job_of({}, None) is None


@pytest.mark.parametrize("decoder", DECODERS)
def test_every_decoder_keeps_the_attempt(tmp_path: Path, monkeypatch, decoder: str) -> None:
    choose(decoder, monkeypatch)
    folder = _folder(tmp_path, "0", "1")
    jobs = {span.job_id for span in load_paths([str(folder)], progress=False, workers=1)}
    assert jobs == {"job-44@0", "job-44@1"}
    with spill.load_spilled([str(folder)], progress=False, workers=1) as source:
        assert source.job_ids() == jobs


def test_several_attempts_ask_for_one_and_the_report_names_the_others(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "0", "1")
    done = analyze(str(folder))
    assert done.returncode == 2
    assert "2 attempts of job job-44 (job-44@0, job-44@1" in done.stderr
    assert "job 'job-44' has 2 attempts" in analyze(str(folder), "--job", "job-44").stderr
    chosen = analyze(str(folder), "--job", "job-44@1", "--format", "json")
    assert chosen.returncode == 0, chosen.stderr
    report = json.loads(chosen.stdout)
    assert report["job_id"] == "job-44@1" and len(report["steps"]) == 4
    assert report["warnings"][0].startswith("job job-44: attempt 1 analysed")
    assert "job-44@0" in report["warnings"][0]


def test_the_job_id_alone_takes_its_only_attempt(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "7")
    done = analyze(str(folder), "--job", "job-44", "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["job_id"] == "job-44@7" and not report["warnings"]


def test_export_chooses_an_attempt_alike(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "in", "0", "1")
    out = tmp_path / "trace.json"
    assert tf_otel_main(["export", str(folder), "--output", str(out)]) == 2
    assert tf_otel_main(["export", str(folder), "--job", "job-44@0", "--output", str(out)]) == 0
    events = json.loads(out.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert any(event.get("ph") == "X" for event in events)
