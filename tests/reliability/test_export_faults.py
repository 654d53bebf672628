"""Every loss is counted and said: collectors down / refusing / hanging / slow, a span file that
cannot be opened, a full disk, and the file's size cap. Real TF training loop, real OTLP clients;
the collectors are real sockets on 127.0.0.1 that misbehave on purpose."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
from conftest import EXAMPLES, base_env, run
from otlp_receiver import HangingCollector
from ports import refused_port

pytestmark = pytest.mark.integration
LOST = re.compile(r"tf_otel: spans were lost: (.*)")


def _train(env: Dict[str, str], steps: int = 30) -> subprocess.CompletedProcess:
    return run(
        ["python", str(EXAMPLES / "custom_loop.py")],
        {**env, "STEPS": str(steps), "TF_OTEL_ENABLED": "1"},
        timeout=180,
    )


def _otlp(endpoint: str, protocol: str = "grpc") -> Dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }


def _http_collector(status: int, delay_s: float = 0.0) -> ThreadingHTTPServer:
    """An OTLP/HTTP endpoint that answers every export with ``status`` after ``delay_s``."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    class Handler(BaseHTTPRequestHandler):
        spans = 0

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            time.sleep(delay_s)
            if status == 200:
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                Handler.spans += sum(
                    len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans
                )
            payload = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.handler = Handler  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def hanging() -> Iterator[HangingCollector]:
    server = HangingCollector()
    yield server
    server.close()


def test_hanging_collector_ends_bounded_and_says_what_was_lost(hanging: HangingCollector):
    env = base_env(**_otlp(f"http://127.0.0.1:{hanging.port}"), TF_OTEL_EXIT_TIMEOUT_S="2")
    started = time.monotonic()
    result = _train(env)
    wall = time.monotonic() - started
    lost = LOST.search(result.stderr)
    assert lost, result.stderr[-3000:]
    # every step span of the 30 steps is named as lost: none was confirmed
    assert re.search(r"OTLPSpanExporter\(.*\): (\d+) of \1 lost", lost.group(1)), lost.group(1)
    assert "unsent when the exit flush gave up" in lost.group(1) or "export failed" in lost.group(1)
    assert hanging.conns, "the exporter never connected"
    assert wall < 60, f"the job took {wall:.1f} s"  # generous: TF import on a loaded machine


def test_hanging_collector_metrics_do_not_hold_the_exit(hanging: HangingCollector):
    """Metrics are on by default: the SDK MeterProvider's own exit would wait up to 30 s on an
    exporter retrying a wedged collector; tf_otel ends the provider it made within bounds."""
    env = base_env(
        **_otlp(f"http://127.0.0.1:{hanging.port}"),
        TF_OTEL_EXIT_TIMEOUT_S="2",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_METRIC_EXPORT_INTERVAL="500",  # the exporter is mid-export when the job ends
        STEPS="30",
        TF_OTEL_ENABLED="1",
    )
    code = (
        "import runpy, sys, time; sys.argv = [sys.argv[0]]; "
        f"runpy.run_path({str(EXAMPLES / 'custom_loop.py')!r}, run_name='__main__'); "
        "print('main-ended', time.time(), flush=True)"
    )
    result = run(["python", "-c", code], env, timeout=180)
    exited = time.time()
    ended = float(result.stdout.split("main-ended")[-1].split()[0])
    assert hanging.conns, "the exporter never connected"
    # traces 2 s + health flush <= 2 s + providers <= 2 s each, and the interpreter's own exit;
    # the SDK's default would be 30 s
    assert exited - ended < 15, (exited - ended, result.stderr[-3000:])


@pytest.mark.parametrize("kind", ["down", "refusing-http-503"])
def test_down_or_refusing_collector_is_counted(kind: str):
    with contextlib.ExitStack() as stack:
        if kind == "down":  # nothing listens there, nor can while the job runs
            port = stack.enter_context(refused_port())
            env = base_env(**_otlp(f"http://127.0.0.1:{port}"))
        else:
            server = _http_collector(503)
            stack.callback(server.shutdown)
            port = server.server_address[1]
            env = base_env(**_otlp(f"http://127.0.0.1:{port}", "http/protobuf"))
        result = _train(env)
    assert "span export is failing" in result.stderr  # said once, when it starts failing
    lost = LOST.search(result.stderr)
    assert lost and "lost" in lost.group(1), result.stderr[-3000:]
    assert "done steps=30" in result.stdout


def test_slow_collector_gets_everything_and_nothing_is_reported_lost():
    server = _http_collector(200, delay_s=0.3)
    port = server.server_address[1]
    env = base_env(**_otlp(f"http://127.0.0.1:{port}", "http/protobuf"))
    try:
        result = _train(env)
    finally:
        server.shutdown()
    assert not LOST.search(result.stderr), result.stderr[-2000:]
    assert server.handler.spans >= 31  # 30 step spans + the job span


def test_unwritable_span_file_is_said_at_start(tmp_path: Path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    target = blocker / "spans.jsonl"
    env = base_env(OTEL_TRACES_EXPORTER="none", TF_OTEL_FILE=str(target))
    result = _train(env, steps=3)
    assert f"TF_OTEL_FILE={str(target)!r} cannot be written" in result.stderr, result.stderr[-2000:]
    assert "done steps=3" in result.stdout
    assert result.stderr.count("TF_OTEL_FILE=") == 1  # one message, not one per export


def test_span_file_rotates_at_its_cap(tmp_path: Path):
    path = tmp_path / "spans.jsonl"
    env = base_env(
        OTEL_TRACES_EXPORTER="none",
        OTEL_BSP_SCHEDULE_DELAY="50",
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="4",  # many small lines
        TF_OTEL_FILE=str(path),
        TF_OTEL_FILE_MAX_MB="0.004",  # ~4 KB per file
        TF_OTEL_FILE_KEEP="2",
    )
    result = _train(env, steps=60)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["spans.1.jsonl", "spans.2.jsonl", "spans.jsonl"], files
    for p in tmp_path.iterdir():
        assert p.stat().st_size <= 4 * 1024 + 4096  # the cap, plus at most one line over
        for line in p.read_text().splitlines():
            assert line.startswith('{"resourceSpans"')  # whole lines only
    assert not LOST.search(result.stderr)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real filesystem that fills up: a 64 KiB tmpfs mounted for the test (root, as in CI)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_disk_stops_the_file_counts_and_training_goes_on(small_disk: Path):
    path = small_disk / "spans.jsonl"
    env = base_env(
        OTEL_TRACES_EXPORTER="none",
        OTEL_BSP_SCHEDULE_DELAY="50",
        TF_OTEL_FILE=str(path),
    )
    result = _train(env, steps=400)
    assert "done steps=400" in result.stdout
    assert f"TF_OTEL_FILE={str(path)!r}: writing stopped (OSError: No space left" in result.stderr
    lost = LOST.search(result.stderr)
    assert lost and "export failed" in lost.group(1), result.stderr[-2000:]
    assert "the span file stopped" in lost.group(1)
    # what was written is whole lines: the partial one was cut off
    text = path.read_text()
    assert text and text.endswith("\n")
    assert all(line.startswith('{"resourceSpans"') for line in text.splitlines())


def test_a_line_cut_by_a_full_disk_is_taken_back_whole(small_disk: Path):
    """Lines shorter than a write buffer (the case a buffered file got wrong): the disk fills
    in the middle of one; the file keeps whole lines only, then stops."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from tf_otel.otel.sdk import OtlpJsonFileExporter

    path = small_disk / "spans.jsonl"
    exporter = OtlpJsonFileExporter(str(path))
    assert exporter.open()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # type: ignore[arg-type]
    tracer = provider.get_tracer("test")
    for i in range(40):  # ~3 KB a line: the 64 KiB disk fills within ~21
        with tracer.start_as_current_span(f"s{i}", attributes={"pad": "x" * 3000}):
            pass
    provider.shutdown()
    text = path.read_text()
    lines = text.splitlines()
    assert 10 < len(lines) < 40 and text.endswith("\n"), (len(lines), text[-80:])
    assert all(json.loads(line)["resourceSpans"] for line in lines)


def test_unknown_and_bad_settings_each_get_one_clear_line():
    env = base_env(
        OTEL_TRACES_EXPORTER="none",
        TF_OTEL_HOROVOD="maybe",
        TF_OTEL_OPS_EVREY="3",
        TF_OTEL_FILE_MAX_MB="lots",
    )
    result = _train(env, steps=2)
    err = result.stderr
    assert "TF_OTEL_HOROVOD='maybe' (expected one of 1/true/yes/on or 0/false/no/off)" in err
    assert (
        "unknown setting TF_OTEL_OPS_EVREY='3' is ignored; did you mean TF_OTEL_OPS_EVERY?" in err
    )
    assert "TF_OTEL_FILE_MAX_MB='lots' (expected a number)" in err
    assert "Traceback" not in err
    assert err.count("TF_OTEL_OPS_EVREY") == 1


def test_analyze_workers_bad_value_is_one_line_not_a_traceback(tmp_path: Path):
    (tmp_path / "spans.jsonl").write_text('{"resourceSpans": []}\n')  # read: workers parsed
    result = run(
        ["tf-otel", "analyze", str(tmp_path)],
        base_env(TF_OTEL_ANALYZE_WORKERS="abc"),
        check=False,
    )
    assert "TF_OTEL_ANALYZE_WORKERS='abc' (expected an integer)" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
