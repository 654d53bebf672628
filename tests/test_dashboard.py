"""The Grafana dashboard against a real metrics store: real tf_otel runs -> the real collector
(collector-config/training.yaml, its metrics pipeline) -> real Prometheus 3 (OTLP receiver,
exemplar storage) on loopback ports, then every dashboard query is parsed by Prometheus's own
PromQL parser (/api/v1/parse_query) and run on /api/v1/query.

    .venv/bin/pytest -q tests/test_dashboard.py       (needs `make tools`: collector + Prometheus)

The live test runs two short jobs into one Prometheus: a 1-process Keras fit fed by tf.data
with a slow decode stage and TF_OTEL_INPUT_WAIT=1 (step and input-wait histograms, host and
process metrics), and a 2-rank horovodrun Keras fit with collective detail on every step
(collective-wait histograms). Metric names referenced by the dashboard must all exist in
Prometheus. On a host without a GPU the NVML gauges of tf_otel/metrics/gpu_metrics.py are sent by
its own code with a stand-in for NVML's readings, so their real names and units are stored.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import yaml

try:  # tests/ as a package (repository root on sys.path) or as pytest's rootdir-less folder
    from tests.backends import (
        COLLECTOR_CONFIG_DIR,
        REPO,
        CollectorServer,
        JaegerServer,
        PrometheusServer,
        collector_log_records,
    )
    from tests.conftest import base_env, horovodrun, python, run
except ImportError:
    from backends import (  # type: ignore[no-redef]
        COLLECTOR_CONFIG_DIR,
        REPO,
        CollectorServer,
        JaegerServer,
        PrometheusServer,
        collector_log_records,
    )
    from conftest import base_env, horovodrun, python, run  # type: ignore[no-redef]

DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "training.json"
DATASOURCES = REPO / "deploy" / "grafana" / "provisioning" / "datasources"
INPUT_JOB = REPO / "tests" / "wholestep" / "input_job.py"
STEP = "tf_otel_step_duration_seconds"
# Grafana's variables, as Grafana would expand them for "All" over the last hour; the rate
# window spans the whole test (the queries run at its end, minutes after the first job ended)
VARIABLES = {
    "$__rate_interval": "10m",
    "$__range": "1h",
    "$job": ".*",
    "$kind": ".*",
}


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _targets() -> Iterator[tuple[str, dict]]:
    for panel in _dashboard()["panels"]:
        for target in panel.get("targets") or []:
            yield panel["title"], target


def expand(expr: str) -> str:
    """The query as Grafana sends it (longest variable names first: $__range / $__rate_...)."""
    for name in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, VARIABLES[name])
    assert "$" not in expr, f"unexpanded variable in {expr}"
    return expr


def selector_names(ast: Any) -> set[str]:
    """Metric names of every vector / matrix selector in a parse_query AST."""
    names: set[str] = set()
    if isinstance(ast, dict):
        if ast.get("type") in ("vectorSelector", "matrixSelector"):
            name = ast.get("name") or next(
                (m["value"] for m in ast.get("matchers") or [] if m["name"] == "__name__"), ""
            )
            assert name, f"selector without a metric name: {ast}"
            names.add(name)
        for value in ast.values():
            names |= selector_names(value)
    elif isinstance(ast, list):
        for value in ast:
            names |= selector_names(value)
    return names


# ----------------------------------------------------------------------------------------------
# static: the provisioning holds together


def test_dashboard_uses_the_provisioned_datasources():
    uids = {}
    for f in DATASOURCES.glob("*.yaml"):
        for ds in yaml.safe_load(f.read_text())["datasources"]:
            uids[ds["uid"]] = ds
    dash = _dashboard()
    assert dash["uid"] == "tf-otel-training"
    targets = list(_targets())
    assert len(targets) >= 10
    for title, target in targets:
        assert target["datasource"]["uid"] == "prometheus", title
        assert target["expr"].strip(), title
    # exemplars on the step-time panel, linked to step traces in Tempo (and Jaeger)
    step = [t for title, t in targets if title.startswith("Step time per rank")]
    assert any(t.get("exemplar") for t in step)
    prom = uids["prometheus"]
    assert prom["type"] == "prometheus" and prom["url"] == "http://prometheus:9090"
    links = prom["jsonData"]["exemplarTraceIdDestinations"]
    assert {d["datasourceUid"] for d in links} <= set(uids)
    assert {d["name"] for d in links} == {"trace_id"}  # the label Prometheus's OTLP path writes
    assert "tempo" in {d["datasourceUid"] for d in links}


def test_dashboard_provider_points_at_the_mounted_folder():
    provider = yaml.safe_load(
        (REPO / "deploy/grafana/provisioning/dashboards/tf_otel.yaml").read_text()
    )["providers"][0]
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]


# ----------------------------------------------------------------------------------------------
# live: real runs -> collector -> Prometheus; the dashboard's queries against what they stored


class _StandInNvml:
    """pynvml's call surface for one GPU with fixed readings: on a host without a GPU, the
    gauges tf_otel/metrics/gpu_metrics.py registers still reach Prometheus under their real names
    and units (only the NVML readings are stand-ins)."""

    NVML_TEMPERATURE_GPU = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=40, memory=5)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=16 << 30, used=3 << 30, free=13 << 30)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 150_000  # mW

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 50


def _push_gpu_gauges(endpoint: str, job_id: str) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    from tf_otel.metrics.gpu_metrics import start_gpu_metrics

    attrs = {"tf_otel.rank": 0, "tf_otel.job.id": job_id}
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=endpoint, insecure=True), export_interval_millis=60_000
    )
    provider = MeterProvider(
        resource=Resource.create({"service.name": "dash-gpu", **attrs}), metric_readers=[reader]
    )
    sampler = start_gpu_metrics(attrs, interval_s=1, meter_provider=provider, nvml=_StandInNvml())
    assert sampler is not None
    provider.force_flush()
    sampler.stop()
    provider.shutdown()


def _wait_for(prom: PrometheusServer, expr: str, timeout: float = 60) -> list:
    deadline = time.monotonic() + timeout
    result: list = []
    while time.monotonic() < deadline:
        doc = prom.query(expr)
        result = doc.get("data", {}).get("result") or []
        if result:
            return result
        time.sleep(1)
    raise AssertionError(f"{expr}: no data after {timeout:.0f} s; names: {prom.metric_names()}")


@pytest.mark.integration
def test_dashboard_queries_run_on_metrics_of_real_runs(tmp_path: Path):
    single_job, hvd_job = f"dash-{uuid.uuid4().hex[:8]}", f"dash-hvd-{uuid.uuid4().hex[:8]}"
    with PrometheusServer() as prom, JaegerServer() as jaeger:
        env = {
            "PROMETHEUS_OTLP_ENDPOINT": prom.otlp_metrics_url,
            "JAEGER_OTLP_ENDPOINT": jaeger.otlp_grpc_address,
            "TEMPO_OTLP_ENDPOINT": jaeger.otlp_grpc_address,
            "TF_OTEL_TAIL_DECISION_WAIT": "2s",
        }
        with CollectorServer(COLLECTOR_CONFIG_DIR / "training.yaml", env=env) as collector:
            common = dict(
                OTEL_EXPORTER_OTLP_ENDPOINT=collector.otlp_grpc_endpoint,
                OTEL_EXPORTER_OTLP_INSECURE="true",
                OTEL_METRICS_EXPORTER="otlp",
                OTEL_METRIC_EXPORT_INTERVAL="1000",
                OTEL_TRACES_SAMPLER="parentbased_traceidratio",
                OTEL_TRACES_SAMPLER_ARG="0.5",
                TF_OTEL_ENABLED="1",
                TF_OTEL_SYSTEM_METRICS_INTERVAL_S="1",
            )
            # 1 process, tf.data from files with a slow stage: step + input-wait histograms
            env1 = base_env(
                **common,
                OTEL_SERVICE_NAME="dash-input",
                TF_OTEL_JOB_ID=single_job,
                TF_OTEL_INPUT_WAIT="1",
                DATA_DIR=str(tmp_path),
                MODE="keras",
                STEPS="40",
                SLOW_MS="20",
            )
            result = run([python(), str(INPUT_JOB)], env1)
            assert "done steps=40" in result.stdout
            # 2 ranks, collective detail on every step: collective-wait histograms
            env2 = base_env(
                **common,
                OTEL_SERVICE_NAME="dash-hvd",
                TF_OTEL_JOB_ID=hvd_job,
                TF_OTEL_HOROVOD_EVERY="1",
                TF_OTEL_TWIN_PREPARE="step",  # every step detailed from the first (30 only)
                STEPS="30",
            )
            horovodrun("horovod_keras.py", env2)

            # both jobs' step histograms arrived (the exporters flush at exit)
            for job, ranks in ((single_job, 1), (hvd_job, 2)):
                got = _wait_for(prom, f'{STEP}_count{{tf_otel_job_id="{job}"}}')
                assert {r["metric"]["tf_otel_rank"] for r in got} == {str(r) for r in range(ranks)}
            _wait_for(
                prom,
                f'tf_otel_step_collective_wait_duration_seconds_count{{tf_otel_job_id="{hvd_job}"}}',
            )
            _wait_for(
                prom,
                f'tf_otel_step_input_wait_duration_seconds_count{{tf_otel_job_id="{single_job}"}}',
            )
            _wait_for(prom, f'system_cpu_utilization_ratio{{tf_otel_job_id="{single_job}"}}')

            if not os.path.exists("/dev/nvidiactl"):  # no GPU: the NVML gauges by stand-in
                _push_gpu_gauges(collector.otlp_grpc_endpoint, single_job)
                _wait_for(prom, f'{{__name__=~"hw_gpu_.+", tf_otel_job_id="{single_job}"}}')
            stored = set(prom.metric_names())
            referenced: set[str] = set()
            failures = []
            for title, target in _targets():
                expr = expand(target["expr"])
                parsed = prom.parse_query(expr)
                assert parsed.get("status") == "success", f"{title}: {expr}: {parsed}"
                referenced |= selector_names(parsed["data"])
                answer = prom.query(expr)
                if answer.get("status") != "success":
                    failures.append(f"{title}: {expr}: {answer}")
                    continue
                # the runs feed every panel (GPU gauges: stand-in readings without a GPU)
                if not answer["data"]["result"]:
                    failures.append(f"{title}: {expr}: no data")
            assert not failures, "\n".join(failures)
            assert STEP + "_bucket" in referenced
            missing = referenced - stored
            assert not missing, f"dashboard names not in Prometheus: {sorted(missing)}"

            # exemplars of the step histogram name step traces: trace ids Prometheus stored
            series = prom.exemplars(f'{STEP}_bucket{{tf_otel_job_id="{hvd_job}"}}')
            ids = {e["labels"].get("trace_id") for s in series for e in s["exemplars"]}
            assert ids and all(re.fullmatch(r"[0-9a-f]{32}", i or "") for i in ids), series
            assert collector.running, collector.log_text()


@pytest.mark.integration
def test_a_wrong_name_is_caught(tmp_path: Path):
    """The comparison above can fail: a name tf_otel does not emit is not in Prometheus, and a
    broken query is refused by the parser."""
    with PrometheusServer() as prom:
        ast = prom.parse_query(
            expand(
                'sum(rate(tf_otel_step_time_seconds_sum{tf_otel_job_id=~"$job"}[$__rate_interval]))'
            )
        )
        assert ast["status"] == "success"
        assert selector_names(ast["data"]) == {"tf_otel_step_time_seconds_sum"}
        assert "tf_otel_step_time_seconds_sum" not in prom.metric_names()
        assert prom.parse_query("sum(rate(x[1m])")["status"] == "error"


@pytest.mark.integration
def test_collector_carries_logs_to_its_file_and_metrics_from_minimal(tmp_path: Path):
    """training.yaml's logs pipeline, its AGPL Loki exporter left out at start as the docs say,
    stores a record in the collector's own file exporter, found by its trace id with the job /
    rank resource; minimal.yaml's metrics pipeline reaches a real Prometheus and its logs the
    debug exporter."""
    from opentelemetry._logs import LogRecord
    from opentelemetry.context import get_current
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    job = f"logs-{uuid.uuid4().hex[:8]}"
    resource = Resource.create(
        {"service.name": "dash-logs", "tf_otel.job.id": job, "tf_otel.rank": 1}
    )

    def send_log(endpoint: str, text: str) -> str:
        provider = LoggerProvider(resource=resource)
        provider.add_log_record_processor(
            SimpleLogRecordProcessor(OTLPLogExporter(endpoint=endpoint, insecure=True))
        )
        tracer = TracerProvider(resource=resource).get_tracer("t")
        with tracer.start_as_current_span("step") as span:
            record = LogRecord(body=text, severity_text="WARN", context=get_current())
            provider.get_logger("tf_otel.test").emit(record)
            trace_id = format(span.get_span_context().trace_id, "032x")
        provider.shutdown()
        return trace_id

    logs_file = tmp_path / "logs" / "logs.jsonl"
    with JaegerServer() as jaeger:
        env = {
            "JAEGER_OTLP_ENDPOINT": jaeger.otlp_grpc_address,
            "TEMPO_OTLP_ENDPOINT": jaeger.otlp_grpc_address,
            "TF_OTEL_LOGS_FILE": str(logs_file),
        }
        without_loki = "yaml:service::pipelines::logs::exporters: [file/logs]"
        with CollectorServer(
            COLLECTOR_CONFIG_DIR / "training.yaml", env=env, overrides=[without_loki]
        ) as collector:
            trace_id = send_log(collector.otlp_grpc_endpoint, "slow input at step 7")
            deadline = time.monotonic() + 60
            found: list = []
            while not found and time.monotonic() < deadline:
                found = [r for r in collector_log_records(logs_file) if r["trace_id"] == trace_id]
                time.sleep(0.5)
            assert [r["body"] for r in found] == ["slow input at step 7"]
            assert found[0]["resource"]["tf_otel.job.id"] == job
            assert found[0]["resource"]["tf_otel.rank"] == 1
            # control: another trace id finds nothing
            assert not [r for r in collector_log_records(logs_file) if r["trace_id"] == "0" * 32]
            assert "loki" not in collector.log_text().lower()

    with PrometheusServer() as prom, JaegerServer() as jaeger:
        env = {
            "JAEGER_OTLP_HTTP_ENDPOINT": jaeger.otlp_http_endpoint,
            "PROMETHEUS_OTLP_ENDPOINT": prom.otlp_metrics_url,
        }
        with CollectorServer(COLLECTOR_CONFIG_DIR / "minimal.yaml", env=env) as collector:
            reader = PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=collector.otlp_grpc_endpoint, insecure=True),
                export_interval_millis=60_000,
            )
            meters = MeterProvider(resource=resource, metric_readers=[reader])
            meters.get_meter("t").create_counter("tf_otel.test.things").add(3)
            meters.shutdown()
            got = _wait_for(prom, f'tf_otel_test_things_total{{tf_otel_job_id="{job}"}}', 30)
            assert [r["value"][1] for r in got] == ["3"]
            send_log(collector.otlp_grpc_endpoint, "to the debug exporter")
            deadline = time.monotonic() + 20
            while "Logs" not in collector.log_text() and time.monotonic() < deadline:
                time.sleep(0.5)
            assert "Logs" in collector.log_text()
