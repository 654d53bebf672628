"""`tf-otel analyze` on a real `horovodrun -np 2` job in which rank 1 is slowed by a known delay
in some steps: it names rank 1 as the straggler of exactly those steps, with the delay within
10 %, both from the OTLP-JSON files (TF_OTEL_FILE) and from a real Jaeger v2."""

from __future__ import annotations

import json
import time

import pytest
from backends import JaegerServer
from conftest import VENV_BIN, base_env, horovodrun, run
from detail_steps import job_with_detail

pytestmark = pytest.mark.integration

DELAY_MS = 150
SLOW_STEPS = {3, 6}
SERVICE = "analyze-real"


def _stragglers(report: dict) -> dict:
    return {
        s["step"]: s["straggler"]
        for s in report["steps"]
        if s["step"] > 0 and s.get("straggler")  # step 0 traces and compiles the function
    }


def _analyze(args) -> dict:
    result = run(
        [
            str(VENV_BIN / "tf-otel"),
            "analyze",
            *args,
            "--format",
            "json",
            "--straggler-min-ms",
            "50",  # ms: above the scheduling noise of a loaded 2-core machine
        ],
        base_env(),
    )
    return json.loads(result.stdout)


@pytest.mark.flaky(reruns=1, reruns_delay=2)  # timing on a shared machine: one more try
def test_rank1_named_as_the_straggler_of_exactly_the_slowed_steps(tmp_path):
    with JaegerServer() as jaeger:
        env = base_env(
            TF_OTEL_ENABLED="1",
            TF_OTEL_HOROVOD_EVERY="1",  # the straggler is found through the collectives:
            # its delay is a numpy_function that holds the rank's executor inside the step, which
            # Horovod's negotiation (the timeline source) sees and the graph stamps do not
            TF_OTEL_HOROVOD_SOURCE="timeline",
            TF_OTEL_FILE=str(tmp_path / "spans-{rank}.jsonl"),
            OTEL_SERVICE_NAME=SERVICE,
            OTEL_EXPORTER_OTLP_ENDPOINT=jaeger.otlp_grpc_endpoint,
            OTEL_EXPORTER_OTLP_INSECURE="true",
            STEPS="10",
            SLOW_RANK="1",
            SLOW_MS=str(DELAY_MS),
            SLOW_STEPS=",".join(map(str, sorted(SLOW_STEPS))),
        )
        horovodrun("horovod_tape.py", env, backend="gloo")
        time.sleep(2)  # the last batches reach Jaeger
        from_files = _analyze([str(tmp_path)])
        from_jaeger = _analyze(["--jaeger", jaeger.query_url, "--service", SERVICE])
    for report in (from_files, from_jaeger):
        train = [s for s in report["steps"] if s["step"] > 0]
        assert len(train) >= 9
        stragglers = _stragglers(report)
        assert set(stragglers) == SLOW_STEPS, stragglers
        for straggler in stragglers.values():
            assert straggler["rank"] == 1
            assert abs(straggler["excess_ms"] - DELAY_MS) <= 0.1 * DELAY_MS, straggler


def test_collective_detail_off_says_communication_not_measured_never_zero(tmp_path):
    """Collective detail off (TF_OTEL_HOROVOD_EVERY=0): the analysis of a real 2-rank Horovod
    job says "not measured" with the setting, never 0 %; with detail on every 2nd step,
    communication is measured on exactly those steps."""
    reports = {}
    for every in ("0", "2"):
        out = tmp_path / f"every-{every}"
        env = base_env(
            TF_OTEL_ENABLED="1",
            TF_OTEL_FILE=str(out / "spans-{rank}.jsonl"),
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
            STEPS="8",
        )
        env["TF_OTEL_HOROVOD_EVERY"] = every
        # detail picked on some, not all, of the steps past the warm-up (0: trace, 1: the
        # twin's first run): a random job id picks all or none of 6 steps 1 time in 32
        env["TF_OTEL_JOB_ID"] = job_with_detail("tf_function:train_step", range(2, 8), 2, "ar")
        horovodrun("horovod_tape.py", env, backend="gloo")
        reports[every] = _analyze([str(out)])
    off = reports["0"]["summary"]
    assert off["categories"]["communication"]["status"] == "not measured", off["categories"]
    assert "TF_OTEL_HOROVOD_EVERY" in off["categories"]["communication"]["setting"]
    assert off["critical_path_share"]["communication"] is None  # not 0.0
    assert off["categories"]["input"]["status"] == "not measured"
    steps = reports["0"]["steps"]
    assert steps and all(s["critical_path_by_category_ms"]["communication"] is None for s in steps)
    on = reports["2"]["summary"]["categories"]["communication"]
    assert on["status"] == "partly measured", on
    assert 0 < on["measured_steps"] < on["steps"]
    assert on["share"] is not None and on["share"] > 0
