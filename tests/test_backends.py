"""Backends against the real binaries: Jaeger v2, the ocb-built collector, the deployment files.

    .venv/bin/pytest -q tests/test_backends.py          (needs `make tools` once, ~15 min)

No Docker here: docker-compose.yml is checked statically (parses, pinned images, mounted files
exist and parse, documented ports, its collector config validates with the built collector).
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml
from opentelemetry import trace as otel_trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

try:  # tests/ as a package (repository root on sys.path) or as pytest's rootdir-less folder
    from tests.backends import (
        BUILD_SCRIPT,
        BUILDER_MANIFEST,
        COLLECTOR_CONFIG_DIR,
        JAEGER_CONFIG,
        REPO,
        BackendError,
        CollectorServer,
        JaegerServer,
        collector_binary,
        validate_collector_config,
    )
except ImportError:
    from backends import (
        BUILD_SCRIPT,
        BUILDER_MANIFEST,
        COLLECTOR_CONFIG_DIR,
        JAEGER_CONFIG,
        REPO,
        BackendError,
        CollectorServer,
        JaegerServer,
        collector_binary,
        validate_collector_config,
    )

COMPOSE = REPO / "docker-compose.yml"
COLLECTOR_CONFIGS = sorted(p for p in COLLECTOR_CONFIG_DIR.glob("*.yaml") if p != BUILDER_MANIFEST)
MS = 1_000_000  # ns


# ----------------------------------------------------------------------------------------------
# helpers: a synthetic tf_otel step trace (trace contract in docs/ARCHITECTURE.md)


class _PresetIds(RandomIdGenerator):
    """Hands out queued trace / span ids first (the contract's derived step ids), then random."""

    def __init__(self) -> None:
        self.trace_ids: list[int] = []
        self.span_ids: list[int] = []

    def generate_trace_id(self) -> int:
        return self.trace_ids.pop(0) if self.trace_ids else super().generate_trace_id()

    def generate_span_id(self) -> int:
        return self.span_ids.pop(0) if self.span_ids else super().generate_span_id()


def step_ids(job_id: str, step: int) -> tuple[int, int]:
    """(step trace id, step root span id) as every rank derives them."""
    base = f"{job_id}/step/{step}"
    tid = int.from_bytes(hashlib.sha256(base.encode()).digest()[:16], "big")
    sid = int.from_bytes(hashlib.sha256(f"{base}/root".encode()).digest()[:8], "big")
    return tid, sid


class Ranks:
    """One TracerProvider per simulated rank (own resource, own host), exporting synchronously."""

    def __init__(self, make_exporter, service: str, job_id: str, world: int = 2):
        self.job_id = job_id
        self.ids = _PresetIds()
        self.providers = []
        for rank in range(world):
            res = Resource.create(
                {
                    "service.name": service,
                    "host.name": f"node{rank}",
                    "tf_otel.rank": rank,
                    "tf_otel.world_size": world,
                    "tf_otel.local_rank": 0,
                    "tf_otel.job.id": job_id,
                    "tf_otel.launcher": "test",
                }
            )
            tp = TracerProvider(resource=res, id_generator=self.ids if rank == 0 else None)
            tp.add_span_processor(SimpleSpanProcessor(make_exporter()))
            self.providers.append(tp)

    def tracer(self, rank: int):
        return self.providers[rank].get_tracer("tf_otel.test")

    @staticmethod
    def common(rank: int, category: str, step: Optional[int]) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "tf_otel.category": category,
            "tf_otel.rank": rank,
            "tf_otel.clock.offset_ns": 0,
            "tf_otel.clock.uncertainty_ns": 20_000,
        }
        if step is not None:
            attrs["tf_otel.step"] = step
        return attrs

    def step(self, step: int, t0: int, dur_ns: int, error: bool = False) -> str:
        """Emit one step: the root (rank 0) and each rank's `step` span inside it."""
        tid, root_sid = step_ids(self.job_id, step)
        root_ctx = otel_trace.set_span_in_context(
            NonRecordingSpan(
                SpanContext(
                    tid, root_sid, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)
                )
            )
        )
        for rank in range(len(self.providers)):
            attrs = {
                **self.common(rank, "step", step),
                "tf_otel.step.kind": "keras_train",
                "tf_otel.step.batches": 1,
                "tensorflow.function.name": "train_function",
            }
            # ranks start a little apart and end a little apart, all inside the root
            span = self.tracer(rank).start_span(
                "train_step", context=root_ctx, attributes=attrs, start_time=t0 + rank * MS
            )
            if error and rank == 1:
                span.set_status(Status(StatusCode.ERROR, "rank 1 failed"))
            span.end(end_time=t0 + dur_ns - (1 - rank) * MS)
        self.ids.trace_ids.append(tid)
        self.ids.span_ids.append(root_sid)
        root_attrs = {
            **self.common(0, "step.root", step),
            "tf_otel.step.ranks": len(self.providers),
            "tf_otel.world_size": len(self.providers),
        }
        root = self.tracer(0).start_span(
            f"step {step}", context=Context(), attributes=root_attrs, start_time=t0
        )
        root.end(end_time=t0 + dur_ns)
        return f"{tid:032x}"

    def job(self, t0: int, dur_ns: int) -> str:
        span = self.tracer(0).start_span(
            "job", context=Context(), attributes=self.common(0, "job", None), start_time=t0
        )
        span.end(end_time=t0 + dur_ns)
        return f"{span.get_span_context().trace_id:032x}"

    def shutdown(self) -> None:
        for tp in self.providers:
            tp.shutdown()


def assert_whole_step(jaeger_trace: dict, trace_id: str, job_id: str, step: int, ranks: int):
    """The step trace has its root and one `step` child per rank, nothing flagged by Jaeger."""
    spans = jaeger_trace["spans"]
    assert len(spans) == ranks + 1, [s["operationName"] for s in spans]
    _, root_sid = step_ids(job_id, step)
    roots = [s for s in spans if JaegerServer.parent_id(s) is None]
    assert [r["spanID"] for r in roots] == [f"{root_sid:016x}"]
    root = roots[0]
    assert JaegerServer.tags(root)["tf_otel.category"] == "step.root"
    children = [s for s in spans if s is not root]
    assert {JaegerServer.parent_id(s) for s in children} == {root["spanID"]}
    seen_ranks = set()
    for child in children:
        tags = JaegerServer.tags(child)
        res = JaegerServer.process_tags(jaeger_trace, child)
        assert tags["tf_otel.category"] == "step"
        assert tags["tf_otel.step"] == step
        assert tags["tf_otel.rank"] == res["tf_otel.rank"]
        assert res["tf_otel.job.id"] == job_id
        seen_ranks.add(tags["tf_otel.rank"])
        # every child inside its parent (Jaeger times are microseconds)
        assert child["startTime"] >= root["startTime"]
        assert child["startTime"] + child["duration"] <= root["startTime"] + root["duration"]
    assert seen_ranks == set(range(ranks))
    assert all(s["traceID"] == trace_id for s in spans)
    assert JaegerServer.span_warnings(jaeger_trace) == []


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ----------------------------------------------------------------------------------------------
# static: build script, compose file, configs


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_file_parses_with_pinned_images():
    services = _compose()["services"]
    assert set(services) == {"collector", "jaeger", "tempo", "prometheus", "loki", "grafana"}
    for name, svc in services.items():
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: unpinned image {image}"
    assert services["jaeger"]["image"].startswith("jaegertracing/jaeger:2.")
    assert services["collector"]["image"].startswith("otel/opentelemetry-collector-contrib:")
    assert services["tempo"]["image"].startswith("grafana/tempo:")
    assert services["grafana"]["image"].startswith("grafana/grafana:")
    assert services["prometheus"]["image"].startswith("prom/prometheus:v3.")
    assert services["loki"]["image"].startswith("grafana/loki:3.")


def test_compose_versions_match_local_builds():
    """Docker users and `make tools` users run the same Jaeger and collector versions."""
    services = _compose()["services"]
    script = BUILD_SCRIPT.read_text()
    release = re.search(r"^JAEGER_RELEASE=\$\{JAEGER_RELEASE:-v(\S+?)\}", script, re.M)
    assert release and services["jaeger"]["image"].endswith(":" + release.group(1))
    dist = yaml.safe_load(BUILDER_MANIFEST.read_text())["dist"]["version"]
    assert services["collector"]["image"].endswith(":" + dist)
    prom = re.search(r"^PROMETHEUS_RELEASE=\$\{PROMETHEUS_RELEASE:-(\S+?)\}", script, re.M)
    assert prom and services["prometheus"]["image"].endswith(":" + prom.group(1))
    # what tests/backends.py PrometheusServer runs: the flags compose gives the image
    flags = services["prometheus"]["command"]
    assert {"--web.enable-otlp-receiver", "--enable-feature=exemplar-storage"} <= set(flags)


def test_compose_ports_as_documented():
    services = _compose()["services"]

    def published(name: str) -> set[str]:
        return {str(p) for p in services[name].get("ports", [])}

    assert published("collector") == {"4317:4317", "4318:4318"}
    assert published("jaeger") == {"16686:16686"}
    assert published("grafana") == {"3000:3000"}
    assert published("tempo") == {"3200:3200"}
    assert published("prometheus") == {"9090:9090"}
    assert published("loki") == {"3100:3100"}
    # the doc states the same ports
    doc = (REPO / "README.md").read_text()
    for port in ("4317", "4318", "16686", "3000", "3200", "9090", "3100"):
        assert port in doc, port


def test_compose_mounts_exist_and_parse():
    mounted = []
    for name, svc in _compose()["services"].items():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            assert src.startswith("./"), f"{name}: {vol} is not a repository file"
            path = (REPO / src).resolve()
            assert path.exists(), f"{name}: {path} is missing"
            files = sorted(path.rglob("*.yaml")) if path.is_dir() else [path]
            files += sorted(path.rglob("*.json")) if path.is_dir() else []
            assert files, f"{name}: nothing to mount in {path}"
            for f in files:
                loaded = json.loads(f.read_text()) if f.suffix == ".json" else None
                loaded = loaded or yaml.safe_load(f.read_text())
                assert isinstance(loaded, dict), f
                mounted.append(f)
    names = {p.name for p in mounted}
    assert {
        "training.yaml",
        "jaeger-v2.yaml",
        "tempo.yaml",
        "prometheus.yaml",
        "loki.yaml",
    } <= names
    assert {"training.json", "tf_otel.yaml"} <= names  # the dashboard and its provider
    # Grafana gets a Tempo datasource pointing at the compose service
    ds = yaml.safe_load((REPO / "deploy/grafana/provisioning/datasources/tempo.yaml").read_text())[
        "datasources"
    ]
    tempo = [d for d in ds if d["type"] == "tempo"]
    assert tempo and tempo[0]["url"] == "http://tempo:3200"


def test_compose_collector_config_validates():
    cmd = _compose()["services"]["collector"]["command"]
    config = next(c.split("=", 1)[1] for c in cmd if c.startswith("--config="))
    vol = next(v for v in _compose()["services"]["collector"]["volumes"] if config in v)
    host_file = REPO / vol.split(":")[0]
    env = {str(k): str(v) for k, v in _compose()["services"]["collector"]["environment"].items()}
    env = {k: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", v) for k, v in env.items()}
    res = validate_collector_config(host_file, env)
    assert res.returncode == 0, res.stdout + res.stderr


def test_jaeger_config_keeps_default_clock_skew_adjuster():
    """Left at Jaeger's default on purpose: tests then see its warnings if we ever skew."""
    doc = yaml.safe_load(JAEGER_CONFIG.read_text())
    assert "max_clock_skew_adjust" not in doc["extensions"]["jaeger_query"]
    assert doc["extensions"]["jaeger_storage"]["backends"]["memstore"]["memory"]


@pytest.mark.parametrize("config", COLLECTOR_CONFIGS, ids=lambda p: p.name)
def test_collector_config_validates(config: Path):
    res = validate_collector_config(config)
    assert res.returncode == 0, res.stdout + res.stderr


def test_collector_validate_rejects_unknown_component(tmp_path: Path):
    """validate really checks: the removed `jaeger` exporter is not in our build."""
    bad = yaml.safe_load((COLLECTOR_CONFIG_DIR / "minimal.yaml").read_text())
    bad["exporters"]["jaeger"] = {"endpoint": "jaeger:14250"}
    bad["service"]["pipelines"]["traces"]["exporters"].append("jaeger")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    res = validate_collector_config(path)
    assert res.returncode != 0
    assert "jaeger" in res.stdout + res.stderr


def test_collector_build_has_exactly_the_used_components():
    """builder-manifest.yaml holds exactly what the configs use, no more, no less."""
    out = subprocess.run(
        [str(collector_binary()), "components"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    built = yaml.safe_load(out.stdout)
    used: dict[str, set[str]] = {}
    for config in COLLECTOR_CONFIGS:
        doc = yaml.safe_load(config.read_text())
        for kind in ("receivers", "processors", "exporters", "extensions"):
            used.setdefault(kind, set()).update(k.split("/")[0] for k in doc.get(kind) or {})
    for kind, names in used.items():
        have = {c["name"] for c in built.get(kind) or []}
        assert have == names, f"{kind}: built {sorted(have)}, configs use {sorted(names)}"


# ----------------------------------------------------------------------------------------------
# live: SDK -> Jaeger, SDK -> collector -> Jaeger


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sdk_exports_to_jaeger_and_reads_back(protocol: str):
    service = _unique(f"tf-otel-{protocol}")
    job_id = _unique("job")
    with JaegerServer() as jaeger:

        def exporter():
            if protocol == "grpc":
                return GrpcSpanExporter(endpoint=jaeger.otlp_grpc_endpoint, insecure=True)
            return HttpSpanExporter(endpoint=jaeger.otlp_http_endpoint + "/v1/traces")

        ranks = Ranks(exporter, service, job_id)
        t0 = time.time_ns() - 5_000 * MS
        tid = ranks.step(7, t0, 250 * MS)
        ranks.shutdown()
        got = jaeger.wait_for_trace(tid, min_spans=3)
        assert_whole_step(got, tid, job_id, 7, ranks=2)
        assert service in jaeger.services()
        assert [t["traceID"] for t in jaeger.traces(service)] == [tid]


@pytest.mark.integration
def test_jaeger_flags_a_child_outside_its_parent():
    """Negative control for the `no warnings` checks: a skewed rank IS reported by Jaeger."""
    service = _unique("tf-otel-skew")
    job_id = _unique("job")
    with JaegerServer() as jaeger:
        ranks = Ranks(
            lambda: GrpcSpanExporter(endpoint=jaeger.otlp_grpc_endpoint, insecure=True),
            service,
            job_id,
        )
        tid, root_sid = step_ids(job_id, 1)
        t0 = time.time_ns() - 5_000 * MS
        ctx = otel_trace.set_span_in_context(
            NonRecordingSpan(SpanContext(tid, root_sid, True, TraceFlags(TraceFlags.SAMPLED)))
        )
        # rank 1's clock 50 ms behind: its step starts before the root does
        child = ranks.tracer(1).start_span(
            "train_step",
            context=ctx,
            attributes=Ranks.common(1, "step", 1),
            start_time=t0 - 50 * MS,
        )
        child.end(end_time=t0 + 50 * MS)
        ranks.ids.trace_ids.append(tid)
        ranks.ids.span_ids.append(root_sid)
        root = ranks.tracer(0).start_span("step 1", context=Context(), start_time=t0)
        root.end(end_time=t0 + 200 * MS)
        ranks.shutdown()
        got = jaeger.wait_for_trace(f"{tid:032x}", min_spans=2)
        warnings = JaegerServer.span_warnings(got)
        assert any("clock skew" in w for w in warnings), warnings


@pytest.mark.integration
def test_training_collector_tail_samples_whole_steps_into_jaeger_and_tempo():
    """SDK (2 ranks) -> collector-config/training.yaml -> Jaeger (and a second Jaeger as Tempo).

    Baseline 0 %: only the slow step, the failed step and the job span may come through, each
    trace whole; the fast step must be dropped by tail sampling.
    """
    service = _unique("tf-otel-e2e")
    job_id = _unique("job")
    with JaegerServer() as jaeger, JaegerServer() as tempo_standin:
        env = {
            "JAEGER_OTLP_ENDPOINT": jaeger.otlp_grpc_address,
            "TEMPO_OTLP_ENDPOINT": tempo_standin.otlp_grpc_address,
            "TF_OTEL_TAIL_DECISION_WAIT": "3s",
            "TF_OTEL_TAIL_SLOW_STEP_MS": "1000",
            "TF_OTEL_TAIL_BASELINE_PERCENT": "0",
        }
        with CollectorServer(COLLECTOR_CONFIG_DIR / "training.yaml", env=env) as collector:
            ranks = Ranks(
                lambda: GrpcSpanExporter(endpoint=collector.otlp_grpc_endpoint, insecure=True),
                service,
                job_id,
            )
            t0 = time.time_ns() - 10_000 * MS
            # short on purpose: kept by the job-span policy alone, not by latency
            job = ranks.job(t0, 50 * MS)
            fast = ranks.step(1, t0 + 100 * MS, 20 * MS)
            slow = ranks.step(2, t0 + 200 * MS, 1_500 * MS)
            failed = ranks.step(3, t0 + 1_800 * MS, 20 * MS, error=True)
            ranks.shutdown()

            for backend in (jaeger, tempo_standin):
                got = backend.wait_for_trace(slow, min_spans=3, timeout=30)
                assert_whole_step(got, slow, job_id, 2, ranks=2)
                got = backend.wait_for_trace(failed, min_spans=3, timeout=30)
                assert_whole_step(got, failed, job_id, 3, ranks=2)
                got = backend.wait_for_trace(job, min_spans=1, timeout=30)
                assert JaegerServer.tags(got["spans"][0])["tf_otel.category"] == "job"
            # the fast step was decided together with the others: it must be gone
            time.sleep(2)
            assert jaeger.trace(fast) is None
            assert tempo_standin.trace(fast) is None
            assert collector.running, collector.log_text()


@pytest.mark.integration
def test_minimal_collector_forwards_over_otlp_http():
    """SDK -> collector-config/minimal.yaml (no sampling) -> OTLP/HTTP -> Jaeger, trace whole."""
    service = _unique("tf-otel-minimal")
    job_id = _unique("job")
    with JaegerServer() as jaeger:
        env = {"JAEGER_OTLP_HTTP_ENDPOINT": jaeger.otlp_http_endpoint}
        with CollectorServer(COLLECTOR_CONFIG_DIR / "minimal.yaml", env=env) as collector:
            ranks = Ranks(
                lambda: HttpSpanExporter(endpoint=collector.otlp_http_endpoint + "/v1/traces"),
                service,
                job_id,
            )
            fast = ranks.step(5, time.time_ns() - 3_000 * MS, 10 * MS)
            ranks.shutdown()
            got = jaeger.wait_for_trace(fast, min_spans=3, timeout=20)
            assert_whole_step(got, fast, job_id, 5, ranks=2)
            assert "Traces" in collector.log_text()  # the debug exporter's line


@pytest.mark.integration
def test_jaeger_server_takes_new_ports_when_one_is_taken():
    jaeger = JaegerServer()
    taken = jaeger.otlp_grpc_port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with jaeger:
            assert jaeger.otlp_grpc_port != taken
            assert jaeger.services() == []


def test_missing_binary_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("TF_OTEL_JAEGER_BIN", str(tmp_path / "no-jaeger"))
    with pytest.raises(BackendError, match="make tools"):
        JaegerServer()
    monkeypatch.setenv("TF_OTEL_COLLECTOR_BIN", str(tmp_path / "no-collector"))
    with pytest.raises(BackendError, match="make tools"):
        CollectorServer(COLLECTOR_CONFIG_DIR / "minimal.yaml")
