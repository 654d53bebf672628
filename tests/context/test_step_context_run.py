"""Acceptance (issue 16, points 1-2): a real `TF_OTEL_ENABLED=1 horovodrun -np 2` job whose own
code makes spans (OpenTelemetry API) and log records (Python logging) before training, during
steps and between steps, with OTLP traces AND logs into the real receiver.

Every span / record made in step N (the script's own count) is in step N's trace, parented under
(spans) or naming (logs) that rank's exported step span; a span made during a step lies inside
its step span after clock correction; the span and record made before training are in no step
trace (control)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
from conftest import REPO, VENV_BIN, base_env, horovodrun, run

pytestmark = pytest.mark.integration
SCRIPT = REPO / "tests" / "context" / "scripts" / "user_spans_train.py"
STEPS = 6
TWIN_THREAD = "tf_otel-twin"  # tf_otel/instrument/detail_twin.py THREAD_NAME


def _step_spans(spans, name_part: str) -> Dict[Tuple[int, int], Any]:
    """(rank, step) -> the rank's exported step span of the training loop."""
    return {
        (s.attributes["tf_otel.rank"], s.attributes["tf_otel.step"]): s
        for s in spans
        if s.category == "step" and name_part in s.name
    }


@pytest.mark.parametrize(
    ("mode", "step_name"), [("loop", "train_step"), ("keras", "train_function")]
)
def test_user_spans_and_logs_land_in_the_step_they_were_made_in(
    receiver, tmp_path: Path, mode, step_name
):
    env = base_env(
        **receiver.env("grpc"),
        TF_OTEL_ENABLED="1",
        TF_OTEL_FILE=str(tmp_path / "spans-{rank}.jsonl"),
        MODE=mode,
        STEPS=str(STEPS),
        OTEL_LOGS_EXPORTER="otlp",
        OTEL_PYTHON_LOG_CORRELATION="true",  # otelTraceID & co. on every LogRecord
    )
    result = horovodrun(str(SCRIPT), env)
    for rank in (0, 1):
        assert f"rank {rank} done mode={mode}" in result.stdout, result.stderr[-3000:]
    spans = receiver.wait_for(
        lambda s: (
            len(_step_spans(s, step_name)) >= 2 * STEPS
            and sum("test.step" in x.attributes for x in s) >= 2 * (STEPS + 2)
        ),
        20,
    )
    steps = _step_spans(spans, step_name)
    assert len(steps) == 2 * STEPS, sorted(steps)
    step_traces = {s.trace_id for s in steps.values()}
    user = [s for s in spans if "test.step" in s.attributes]
    # per rank: before training, "during trace" (once per tracing of the step function: at
    # least once), one "between" per step
    names = sorted((s.name, s.attributes["test.rank"]) for s in user)
    assert len(user) >= 2 * (STEPS + 2), names
    for rank in (0, 1):
        assert ("before training", rank) in names and ("during trace", rank) in names
        assert all((f"between {n}", rank) in names for n in range(STEPS))
    twin = [s for s in user if s.attributes["test.thread"] == TWIN_THREAD]
    for rank in (0, 1):
        # the detail twin's trace reran the step function's Python on tf_otel's thread, after
        # the step that traced it: its span is in that step's trace, under the rank's step span
        traced_in = [
            steps[(rank, s.attributes["test.step"])]
            for s in user
            if s.name == "during trace"
            and s.attributes["test.rank"] == rank
            and s.attributes["test.thread"] != TWIN_THREAD
        ]
        mine = [s for s in twin if s.attributes["test.rank"] == rank]
        assert mine, f"rank {rank}: no span of the twin's trace"
        for span in mine:
            assert any(
                span.trace_id == p.trace_id and span.parent_id == p.span_id for p in traced_in
            ), (span, traced_in)
    for span in user:
        rank, n = span.attributes["test.rank"], span.attributes["test.step"]
        if n < 0:  # control: made before the first step
            assert span.trace_id not in step_traces and span.parent_id is None, span
            continue
        if span.attributes["test.thread"] == TWIN_THREAD:
            continue
        parent = steps[(rank, n)]
        assert span.trace_id == parent.trace_id, (span.name, rank, n)
        assert span.parent_id == parent.span_id, (span.name, rank, n)
        assert span.resource.get("tf_otel.rank") == rank
        if span.name == "during trace":  # made inside the step: inside its span, corrected
            assert parent.start_ns <= span.start_ns <= span.end_ns <= parent.end_ns, span.name
        else:  # made after step n returned
            assert (
                span.start_ns >= parent.end_ns - parent.attributes["tf_otel.clock.uncertainty_ns"]
            )
    logs = receiver.wait_for_logs(
        lambda records: sum("test_step" in r.attributes for r in records) >= len(user), 20
    )
    mine = [r for r in logs if "test_step" in r.attributes]
    assert len(mine) == len(user), [r.body for r in mine]
    twin_traces = {s.trace_id for s in twin}
    for rec in mine:
        rank, n = rec.attributes["test_rank"], rec.attributes["test_step"]
        assert rec.resource.get("tf_otel.rank") == rank
        if n < 0:
            assert rec.trace_id not in step_traces
            continue
        if rec.attributes["test_thread"] == TWIN_THREAD:
            assert rec.trace_id in twin_traces, rec.body
            continue
        step = steps[(rank, n)]
        # the user's span is current when the record is made: its trace is the step's
        assert rec.trace_id == step.trace_id, (rec.body, rank, n)
        assert rec.attributes["otelTraceID"] == step.trace_id  # logging-instrumentation names
        assert rec.attributes["otelTraceSampled"] is True
    _analysis_ignores_user_spans(tmp_path)


def _analysis_ignores_user_spans(directory: Path) -> None:
    """The user spans in the step traces change nothing in `tf-otel analyze` (control: the same
    files with every span that has no tf_otel.category removed)."""
    removed = 0
    for rank in (0, 1):
        lines = []
        for line in (directory / f"spans-{rank}.jsonl").read_text().splitlines():
            data = json.loads(line)
            for resource_spans in data.get("resourceSpans", []):
                for scope_spans in resource_spans.get("scopeSpans", []):
                    spans = scope_spans.get("spans", [])
                    kept = [
                        s
                        for s in spans
                        if any(a["key"] == "tf_otel.category" for a in s.get("attributes", []))
                    ]
                    removed += len(spans) - len(kept)
                    scope_spans["spans"] = kept
            lines.append(json.dumps(data))
        (directory / "ours").mkdir(exist_ok=True)
        (directory / "ours" / f"spans-{rank}.jsonl").write_text("\n".join(lines) + "\n")
    assert removed >= 2 * (STEPS + 2)  # the user spans were in the files
    outputs = []
    for files in (directory, directory / "ours"):
        result = run(
            [str(VENV_BIN / "tf-otel"), "analyze", "--format", "json"]
            + [str(files / f"spans-{rank}.jsonl") for rank in (0, 1)],
            base_env(),
        )
        outputs.append(result.stdout.replace(str(directory / "ours"), str(directory)))
    assert outputs[0] == outputs[1]
