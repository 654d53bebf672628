"""What each export fault costs a training job: whole-process wall time against the same job with
a healthy collector (interleaved rounds, rotated order), peak RSS, and spans lost as tf_otel's
exit line counts them. The job is examples/custom_loop.py (STEPS tf.function steps).

    .venv/bin/python bench/bench_faults.py [--rounds 3] [--steps 300]

Faults: collector down (closed port), refusing (HTTP 503), hanging (accepts, never answers),
slow (answers after 300 ms), full disk for TF_OTEL_FILE (a 64 KiB tmpfs; root). Writes the
table into docs/benchmarks/faults.md (--out), between its generated-section markers
(harness.write_generated: the hand-written rest of the file stays).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import harness

REPO = Path(__file__).resolve().parent.parent
TITLE = "Export faults: what they cost the job"
sys.path.insert(0, str(REPO / "tests"))
from otlp_receiver import OtlpReceiver  # noqa: E402
from ports import free_ports  # noqa: E402

LOST = re.compile(r"tf_otel: spans were lost: (.*)")


def _otlp(endpoint: str, protocol: str = "grpc") -> Dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_TRACES_EXPORTER": "otlp",
    }


def _http_server(status: int, delay_s: float) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            time.sleep(delay_s)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _hanging() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held: List[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(sock.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return sock


def run_job(extra: Dict[str, str], steps: int) -> Tuple[float, float, str]:
    """(wall s, peak RSS MB, the exit line's loss text or '')."""
    env = harness.job_env(TF_OTEL_ENABLED="1", STEPS=str(steps), **extra)
    job = harness.launch([sys.executable, str(REPO / "examples" / "custom_loop.py")], env)
    lost = LOST.search(job.stderr)
    return job.wall_s, job.peak_rss_mb, lost.group(1) if lost else ""


def write_doc(path: Path, text: str) -> None:
    """``text`` as the generated section of the doc at ``path``; the rest of the file stays."""
    harness.write_generated(path, "bench_faults", text, TITLE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default=str(harness.RESULTS / "faults.md"))
    args = parser.parse_args()

    receiver = OtlpReceiver().start()
    refusing = _http_server(503, 0.0)
    slow = _http_server(200, 0.3)
    hanging = _hanging()
    disk = tempfile.mkdtemp(prefix="tf_otel-fulldisk-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", disk], check=True)
    modes: Dict[str, Callable[[], Dict[str, str]]] = {
        "healthy collector": lambda: receiver.env("grpc"),
        "collector down": lambda: _otlp(f"http://127.0.0.1:{free_ports()[0]}"),
        "collector refusing (503)": lambda: _otlp(
            f"http://127.0.0.1:{refusing.server_address[1]}", "http/protobuf"
        ),
        "collector hanging": lambda: _otlp(f"http://127.0.0.1:{hanging.getsockname()[1]}"),
        "collector slow (300 ms)": lambda: _otlp(
            f"http://127.0.0.1:{slow.server_address[1]}", "http/protobuf"
        ),
        "disk full (TF_OTEL_FILE)": lambda: {
            "OTEL_TRACES_EXPORTER": "none",
            "TF_OTEL_FILE": os.path.join(disk, f"spans-{time.monotonic_ns()}.jsonl"),
        },
    }
    names = list(modes)

    def run(r: int, name: str) -> Tuple[float, float, str]:
        for f in Path(disk).iterdir():
            f.unlink()
        result = run_job(modes[name](), args.steps)
        print(f"round {r + 1} {name}: {result[0]:.1f} s", flush=True)
        return result

    try:
        results = harness.interleaved(names, args.rounds, run)
    finally:
        subprocess.run(["umount", "-l", disk], check=False)
        os.rmdir(disk)
        receiver.stop()
    load = os.getloadavg()
    base = statistics.median(w for w, _, _ in results["healthy collector"])
    rows = [
        f"`bench/bench_faults.py --rounds {args.rounds} --steps {args.steps}`: "
        "examples/custom_loop.py, whole-process wall time (TF import included) against a healthy "
        f"collector, interleaved rounds. Load average at the end: {load[0]:.1f} {load[1]:.1f} "
        f"{load[2]:.1f} (2 cores).",
        "",
        "| fault | wall s (median) | vs healthy | peak RSS MB | tf_otel's exit line (last round) |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        walls = [w for w, _, _ in results[name]]
        rss = max(m for _, m, _ in results[name])
        lost = results[name][-1][2] or "(nothing lost)"
        rows.append(
            f"| {name} | {statistics.median(walls):.1f} | {statistics.median(walls) / base:.2f}× "
            f"| {rss:.0f} | {lost} |"
        )
    text = "\n".join(rows) + "\n"
    print(text)
    write_doc(Path(args.out), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
