"""Host and process metrics reach a real OTLP receiver with semconv names and the rank / job
resource attributes; on a host without a GPU no hw.gpu.* metric appears and nothing fails."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import base_env, python, run  # noqa: E402

pytestmark = pytest.mark.integration

JOB = str(Path(__file__).resolve().parent / "input_job.py")
SEMCONV = {
    "system.cpu.utilization",
    "system.memory.usage",
    "system.network.io",
    "process.cpu.utilization",
    "process.memory.usage",
}


@pytest.mark.parametrize("interval", ["0.5", "0"], ids=["on", "off"])
def test_system_metrics_reach_the_receiver(receiver, tmp_path, interval):
    env = base_env(
        **receiver.env("grpc"),
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_METRIC_EXPORT_INTERVAL="500",
        TF_OTEL_ENABLED="1",
        TF_OTEL_JOB_ID="job-sm",
        TF_OTEL_SYSTEM_METRICS_INTERVAL_S=interval,
        DATA_DIR=str(tmp_path),
        MODE="loop",
        STEPS="40",
        SLOW_MS="30",
    )
    result = run([python(), JOB], env)
    assert "done steps=40" in result.stdout
    assert "Traceback" not in result.stderr
    if interval == "0":
        points = receiver.wait_for_points(
            lambda p: any(x.name.startswith("tf_otel.") for x in p), 10
        )
        assert not [p for p in points if p.name.startswith(("system.", "process."))]
        return
    points = receiver.wait_for_points(lambda p: SEMCONV <= {x.name for x in p}, 20)
    names = {p.name for p in points}
    assert SEMCONV <= names, names
    assert not [n for n in names if n.startswith("hw.gpu")]  # this CI host has no GPU
    system = [p for p in points if p.name in SEMCONV]
    assert {p.resource["tf_otel.rank"] for p in system} == {0}
    assert {p.resource["tf_otel.job.id"] for p in system} == {"job-sm"}
    memory = [p.value for p in system if p.name == "process.memory.usage"]
    assert min(memory) > 50 * 2**20  # TF is loaded: the process holds hundreds of MB
