"""`make demo`: a traced 2-rank Horovod job into the locally built Jaeger v2, then the analysis.

Starts Jaeger (left running in the background so the traces stay browsable; the previous demo's
Jaeger is replaced), runs `TF_OTEL_ENABLED=1 horovodrun -np 2` on examples/horovod_tape.py with
rank 1 slowed in two steps, prints `tf-otel analyze` read back from Jaeger, and where to look.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from backends import JAEGER_CONFIG, jaeger_binary  # noqa: E402

OUT = REPO / "out" / "demo"
PID_FILE = OUT / "jaeger.pid"
VENV_BIN = Path(sys.executable).parent
# deploy/jaeger-v2.yaml reads these; a taken default port is replaced by a free one
PORTS = {
    "JAEGER_OTLP_GRPC_PORT": 4317,
    "JAEGER_OTLP_HTTP_PORT": 4318,
    "JAEGER_QUERY_HTTP_PORT": 16686,
    "JAEGER_QUERY_GRPC_PORT": 16685,
}
SERVICE = "tf-otel-demo"


def say(text: str) -> None:
    print(f"\033[1m[demo]\033[0m {text}", flush=True)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_previous() -> None:
    try:
        pid = int(PID_FILE.read_text().split()[0])
        os.killpg(pid, signal.SIGTERM)
        say(f"stopped the previous demo's Jaeger (pid {pid})")
        time.sleep(1.0)
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        pass


START_TRIES = 3  # a port found free can be taken before Jaeger binds it: new ports, again
PORT_TAKEN = "address already in use"


def start_jaeger() -> dict:
    ports = {name: (p if port_free(p) else free_port()) for name, p in PORTS.items()}
    for attempt in range(1, START_TRIES + 1):
        started = _start_jaeger(ports)
        if started is not None:
            return started
        if attempt == START_TRIES:
            break
        say(f"a port was taken before Jaeger bound it; trying again with others ({attempt})")
        ports = {name: free_port() for name in PORTS}
    sys.exit(
        f"[demo] Jaeger could not bind its ports ({START_TRIES} tries); see {OUT / 'jaeger.log'}"
    )


def _start_jaeger(ports: dict) -> Optional[dict]:
    """Jaeger on ``ports``, answering; None where it exited because a port was taken."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({name: str(port) for name, port in ports.items()})
    with open(OUT / "jaeger.log", "w") as log:  # the background process keeps its own copy
        proc = subprocess.Popen(
            [str(jaeger_binary()), "--config", str(JAEGER_CONFIG)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    PID_FILE.write_text(f"{proc.pid}\n")
    query = f"http://127.0.0.1:{ports['JAEGER_QUERY_HTTP_PORT']}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{query}/api/services", timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None:
                if PORT_TAKEN in (OUT / "jaeger.log").read_text(errors="replace"):
                    return None
                sys.exit(f"[demo] Jaeger exited; see {OUT / 'jaeger.log'}")
            time.sleep(0.3)
    else:
        sys.exit(f"[demo] Jaeger did not answer on {query}; see {OUT / 'jaeger.log'}")
    say(
        f"Jaeger v2 running (pid {proc.pid}): OTLP grpc :{ports['JAEGER_OTLP_GRPC_PORT']}, "
        f"http :{ports['JAEGER_OTLP_HTTP_PORT']}, query {query}"
    )
    return {"query": query, "otlp": f"http://127.0.0.1:{ports['JAEGER_OTLP_GRPC_PORT']}"}


def run_job(jaeger: dict) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        TF_OTEL_ENABLED="1",
        TF_OTEL_HOROVOD_EVERY="1",  # collective detail on every step: the demo shows it off
        # rank 1's delay holds its executor inside the step: Horovod's negotiation sees it
        TF_OTEL_HOROVOD_SOURCE="timeline",
        # both ranks begin the step together, and a response-cache hit's negotiation does not
        # say which rank came last: the cache off, every rank has its own ready tick
        TF_OTEL_HOROVOD_EXACT="1",
        TF_OTEL_FILE=str(OUT / "spans-rank{rank}.jsonl"),
        OTEL_SERVICE_NAME=SERVICE,
        OTEL_EXPORTER_OTLP_ENDPOINT=jaeger["otlp"],
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_METRICS_EXPORTER="none",  # Jaeger keeps traces only (docker compose keeps metrics)
        TF_CPP_MIN_LOG_LEVEL="2",
        STEPS="12",
        SLOW_RANK="1",
        SLOW_MS="80",
        SLOW_STEPS="4,9",
    )
    for old in OUT.glob("spans-rank*.jsonl"):
        old.unlink()
    command = [
        str(VENV_BIN / "horovodrun"),
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
        str(VENV_BIN / "python"),
        str(REPO / "examples" / "horovod_tape.py"),
    ]
    say(
        "running: TF_OTEL_ENABLED=1 TF_OTEL_HOROVOD_EVERY=1 TF_OTEL_HOROVOD_SOURCE=timeline "
        "TF_OTEL_HOROVOD_EXACT=1 " + " ".join(command[:6]) + " python examples/horovod_tape.py"
    )
    say("(rank 1 sleeps 80 ms before its gradients in steps 4 and 9)")
    result = subprocess.run(command, env=env, cwd=REPO)
    if result.returncode != 0:
        sys.exit(f"[demo] the training job failed with exit code {result.returncode}")


def analyze(jaeger: dict) -> None:
    tf_otel = str(VENV_BIN / "tf-otel")
    time.sleep(2.0)  # the last batches and step roots reach Jaeger
    say(f"tf-otel analyze --jaeger {jaeger['query']} --service {SERVICE}")
    common = [tf_otel, "analyze", "--jaeger", jaeger["query"], "--service", SERVICE]
    subprocess.run(common + ["--html", str(OUT / "report.html")], check=True)
    report = subprocess.run(
        common + ["--format", "json"], check=True, capture_output=True, text=True
    )
    steps = json.loads(report.stdout).get("steps", [])
    warm = [s for s in steps if not s.get("warmup")] or steps  # warm-up: tracing the function
    for step in warm:
        found = step.get("straggler")
        if found:
            say(
                f"step {step.get('step')}: rank {found['rank']} held the step up by "
                f"{found.get('delay_ms', found['excess_ms']):.1f} ms ({found.get('category')}); "
                f"{step['duration_ms']:.1f} ms -> {step['what_if_ms']:.1f} ms without it"
            )
    if warm:
        slowest = max(warm, key=lambda s: s.get("duration_ms", 0))
        trace_id = slowest.get("trace_id", "")
        say(
            f"slowest step after the first: {slowest.get('step')} "
            f"({slowest.get('duration_ms', 0):.1f} ms), trace {trace_id}"
        )
        say(f"  its spans: {jaeger['query']}/api/traces/{trace_id}")
    say(f"all traces: {jaeger['query']}/api/traces?service={SERVICE}")
    say(f"HTML report with swimlanes: {OUT / 'report.html'}")
    say(f"the same spans as OTLP-JSON: {OUT}/spans-rank*.jsonl (tf-otel analyze {OUT})")
    pid = PID_FILE.read_text().strip()
    say(f"Jaeger keeps running in the background; stop it with: kill -- -{pid}")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    stop_previous()
    jaeger = start_jaeger()
    run_job(jaeger)
    analyze(jaeger)


if __name__ == "__main__":
    main()
