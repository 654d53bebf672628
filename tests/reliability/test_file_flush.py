"""TF_OTEL_FILE is written while the process runs, at least every TF_OTEL_FILE_FLUSH_S (issue 44:
a SIGKILLed rank loses about a second of spans, not its run), and a process appending to a file
whose last record was cut short starts its own on a new line."""

from __future__ import annotations

import json
import time
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

from tf_otel.config import Settings
from tf_otel.otel import sdk


def _lines(path: Path) -> list:
    return path.read_bytes().splitlines()


def test_spans_reach_the_file_within_the_flush_delay(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("OTEL_BSP_SCHEDULE_DELAY", raising=False)
    path = tmp_path / "spans.jsonl"
    provider = TracerProvider()
    assert sdk.add_file_exporter(str(path), provider=provider, flush_s=0.2)
    tracer = provider.get_tracer("t")
    try:
        written = []
        for batch in range(3):  # three bursts of spans, each on the file within ~0.2 s
            for n in range(5):
                tracer.start_span(f"s{batch}.{n}").end()
            deadline = time.monotonic() + 2.0
            while len(_lines(path)) <= batch and time.monotonic() < deadline:
                time.sleep(0.02)
            written.append(len(_lines(path)))
        assert written == [1, 2, 3]  # one record a burst, before any shutdown
        names = [
            span["name"]
            for line in _lines(path)
            for span in json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]
        ]
        assert len(names) == 15
    finally:
        provider.shutdown()


def test_the_default_and_a_shorter_sdk_delay(tmp_path: Path, monkeypatch) -> None:
    def delay(**env: str) -> float:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        provider = TracerProvider()
        sdk.add_file_exporter(str(tmp_path / "d.jsonl"), provider=provider)
        (processor,) = provider._active_span_processor._span_processors
        found = processor._batch_processor._schedule_delay
        provider.shutdown()
        return found

    monkeypatch.delenv("OTEL_BSP_SCHEDULE_DELAY", raising=False)
    assert delay() == sdk.FILE_FLUSH_S == Settings().file_flush_s == 0.5  # not the SDK's 5 s
    assert delay(OTEL_BSP_SCHEDULE_DELAY="50") == 0.05
    assert delay(OTEL_BSP_SCHEDULE_DELAY="60000") == 0.5
    assert Settings.from_env({"TF_OTEL_FILE_FLUSH_S": "2"}).file_flush_s == 2.0


def test_appending_after_a_record_cut_short_starts_a_new_line(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    path.write_bytes(b'{"resourceSpans":[{"resource":{}},\n{"resourceSpans":[{"reso')  # killed
    exporter = sdk.OtlpJsonFileExporter(str(path))
    assert exporter.open()
    provider = TracerProvider()
    tracer = provider.get_tracer("t")
    span = tracer.start_span("after")
    span.end()
    exporter.export([span])
    exporter.shutdown()
    lines = _lines(path)
    assert lines[1] == b'{"resourceSpans":[{"reso' and json.loads(lines[2])  # ours whole
    exporter = sdk.OtlpJsonFileExporter(str(path))  # a whole last line: nothing added
    assert exporter.open()
    exporter.shutdown()
    assert _lines(path) == lines
