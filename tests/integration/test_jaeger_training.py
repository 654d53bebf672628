"""Real training runs exported into a real Jaeger v2 (built by `make tools`), read back through
its HTTP query API; and training -> the project's collector config -> Jaeger."""

from __future__ import annotations

from collections import defaultdict

import pytest
from backends import COLLECTOR_CONFIG_DIR, CollectorServer, JaegerServer
from conftest import base_env, example, horovodrun, python, run

pytestmark = pytest.mark.integration


def _step_traces(jaeger: JaegerServer, service: str, expected: int):
    traces = jaeger.wait_for_traces(service, expected, timeout=60)
    return [
        t
        for t in traces
        if any(JaegerServer.tags(s).get("tf_otel.category") == "step.root" for s in t["spans"])
    ]


def _assert_well_formed(trace: dict, ranks: int) -> None:
    spans = {s["spanID"]: s for s in trace["spans"]}
    roots = [s for s in spans.values() if JaegerServer.parent_id(s) is None]
    assert len(roots) == 1, [s["operationName"] for s in roots]
    assert JaegerServer.tags(roots[0])["tf_otel.category"] == "step.root"
    seen_ranks = set()
    for span in spans.values():
        parent_id = JaegerServer.parent_id(span)
        if parent_id is None:
            continue
        parent = spans[parent_id]
        assert parent["startTime"] <= span["startTime"]
        assert span["startTime"] + span["duration"] <= parent["startTime"] + parent["duration"]
        tags = JaegerServer.tags(span)
        if tags.get("tf_otel.category") == "step":
            seen_ranks.add(tags["tf_otel.rank"])
            assert JaegerServer.process_tags(trace, span)["tf_otel.rank"] == tags["tf_otel.rank"]
    assert seen_ranks == set(range(ranks))
    assert JaegerServer.span_warnings(trace) == []


def test_single_process_steps_in_jaeger():
    with JaegerServer() as jaeger:
        env = base_env(
            TF_OTEL_ENABLED="1",
            STEPS="6",
            OTEL_SERVICE_NAME="jaeger-single",
            OTEL_EXPORTER_OTLP_ENDPOINT=jaeger.otlp_grpc_endpoint,
            OTEL_EXPORTER_OTLP_INSECURE="true",
        )
        run([python(), example("custom_loop.py")], env)
        traces = _step_traces(jaeger, "jaeger-single", 7)  # 6 steps + the job trace
        steps = sorted(
            JaegerServer.tags(s)["tf_otel.step"]
            for t in traces
            for s in t["spans"]
            if JaegerServer.tags(s).get("tf_otel.category") == "step"
        )
        assert steps == list(range(6))
        for trace in traces:
            _assert_well_formed(trace, ranks=1)


def test_horovod_two_ranks_in_jaeger():
    with JaegerServer() as jaeger:
        env = base_env(
            TF_OTEL_ENABLED="1",
            STEPS="5",
            OTEL_SERVICE_NAME="jaeger-hvd",
            OTEL_EXPORTER_OTLP_ENDPOINT=jaeger.otlp_http_endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        )
        horovodrun("horovod_tape.py", env, backend="gloo")
        traces = _step_traces(jaeger, "jaeger-hvd", 6)
        by_step = defaultdict(list)
        for trace in traces:
            root = next(s for s in trace["spans"] if JaegerServer.parent_id(s) is None)
            if "train_step" in root["operationName"]:
                by_step[JaegerServer.tags(root)["tf_otel.step"]].append(trace)
                _assert_well_formed(trace, ranks=2)
        assert sorted(by_step) == list(range(5))
        assert all(len(v) == 1 for v in by_step.values()), "one trace per step"


def test_training_through_the_collector_into_jaeger():
    with JaegerServer() as jaeger, JaegerServer() as tempo_standin:
        collector_env = {
            "JAEGER_OTLP_ENDPOINT": jaeger.otlp_grpc_address,
            "TEMPO_OTLP_ENDPOINT": tempo_standin.otlp_grpc_address,
            "TF_OTEL_TAIL_DECISION_WAIT": "3s",
            "TF_OTEL_TAIL_BASELINE_PERCENT": "100",
        }
        with CollectorServer(COLLECTOR_CONFIG_DIR / "training.yaml", env=collector_env) as coll:
            env = base_env(
                TF_OTEL_ENABLED="1",
                STEPS="4",
                OTEL_SERVICE_NAME="via-collector",
                OTEL_EXPORTER_OTLP_ENDPOINT=coll.otlp_grpc_endpoint,
                OTEL_EXPORTER_OTLP_INSECURE="true",
            )
            horovodrun("horovod_tape.py", env, backend="gloo")
            for backend in (jaeger, tempo_standin):
                traces = _step_traces(backend, "via-collector", 5)
                train = [
                    t for t in traces if any("train_step" in s["operationName"] for s in t["spans"])
                ]
                assert len(train) == 4
                for trace in train:
                    _assert_well_formed(trace, ranks=2)
