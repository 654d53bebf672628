"""tf_otel's own health reaches a real OTLP receiver as metrics on the job's resource, and a loss
(spans dropped by a full SDK queue) shows there and in the exit line."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES, base_env, run

pytestmark = pytest.mark.integration


def _latest(points, name, **attrs):
    matching = [
        p
        for p in points
        if p.name == name and all(p.attributes.get(k) == v for k, v in attrs.items())
    ]
    return matching[-1] if matching else None


def _run(receiver, **extra):
    env = base_env(
        **{**receiver.env("grpc"), **extra},
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_METRIC_EXPORT_INTERVAL="300",
        TF_OTEL_ENABLED="1",
        TF_OTEL_JOB_ID="health-job",
        STEPS="40",
    )
    return run(["python", str(EXAMPLES / "custom_loop.py")], env, timeout=180)


def test_health_metrics_with_the_job_resource(receiver):
    result = _run(receiver)
    points = receiver.wait_for_points(lambda p: _latest(p, "tf_otel.spans.exported"), 10)
    exported = _latest(points, "tf_otel.spans.exported")
    assert exported is not None, sorted({p.name for p in points})
    assert exported.resource["tf_otel.job.id"] == "health-job"
    assert exported.resource["tf_otel.rank"] == 0
    assert exported.attributes["tf_otel.exporter"].startswith("OTLPSpanExporter")
    names = {p.name for p in points}
    assert {
        "tf_otel.spans.ended",
        "tf_otel.spans.lost",
        "tf_otel.queue.depth",
        "tf_otel.clock.uncertainty",
        "tf_otel.steps.dropped",
    } <= names
    # the last collection (at exit) has the final counts: all 40 step spans + the job span
    ended = _latest(points, "tf_otel.spans.ended").value
    assert ended >= 41
    assert _latest(points, "tf_otel.spans.exported").value >= 40
    for cause in ("export_failed", "queue_full"):
        assert _latest(points, "tf_otel.spans.lost", **{"tf_otel.cause": cause}).value == 0
    assert "spans were lost" not in result.stderr


def test_queue_drops_are_counted_in_metrics_and_at_exit(receiver):
    # a 2-span SDK queue exported once a minute: almost every span is dropped by the SDK
    result = _run(
        receiver,
        OTEL_BSP_MAX_QUEUE_SIZE="2",
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="2",
        OTEL_BSP_SCHEDULE_DELAY="60000",
    )
    assert "dropped from the full export queue" in result.stderr, result.stderr[-2000:]
    points = receiver.wait_for_points(
        lambda p: (
            (_latest(p, "tf_otel.spans.lost", **{"tf_otel.cause": "queue_full"}) or 0)
            and _latest(p, "tf_otel.spans.lost", **{"tf_otel.cause": "queue_full"}).value > 0
        ),
        10,
    )
    lost = _latest(points, "tf_otel.spans.lost", **{"tf_otel.cause": "queue_full"})
    assert lost is not None and lost.value > 0
