"""Real backends for tests: a local Jaeger v2, an OpenTelemetry Collector and Prometheus 3.

The binaries are built by `make tools` (scripts/build_go_tools.sh) into
${TF_OTEL_CACHE:-~/.cache/tf_otel}/bin; $TF_OTEL_JAEGER_BIN / $TF_OTEL_COLLECTOR_BIN /
$TF_OTEL_PROMETHEUS_BIN override. Nothing AGPL-licensed is built or run (docs/LICENSES.md): log
records are checked in the collector's own file exporter (collector_log_records).
A missing binary raises BackendError (tests fail, they do not skip).

    with JaegerServer() as jaeger:                      # free ports on 127.0.0.1
        exporter = OTLPSpanExporter(endpoint=jaeger.otlp_grpc_endpoint, insecure=True)
        ...
        trace = jaeger.wait_for_trace(trace_id_hex, min_spans=3)
        assert not JaegerServer.span_warnings(trace)    # e.g. clock-skew adjuster warnings

    env = {"JAEGER_OTLP_ENDPOINT": jaeger.otlp_grpc_address}
    with CollectorServer(COLLECTOR_CONFIG_DIR / "training.yaml", env=env) as collector:
        ...  # export to collector.otlp_grpc_endpoint

    with PrometheusServer() as prom:                    # OTLP receiver, exemplar storage on
        env = {"PROMETHEUS_OTLP_ENDPOINT": prom.otlp_metrics_url}
        names = prom.metric_names()
        prom.query('rate(tf_otel_step_duration_seconds_count[1m])')
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

if str(Path(__file__).resolve().parent) not in sys.path:  # as tests.backends: tests/ for ports
    sys.path.append(str(Path(__file__).resolve().parent))
from ports import free_ports  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "scripts" / "build_go_tools.sh"
COLLECTOR_CONFIG_DIR = REPO / "collector-config"
BUILDER_MANIFEST = COLLECTOR_CONFIG_DIR / "builder-manifest.yaml"
JAEGER_CONFIG = REPO / "deploy" / "jaeger-v2.yaml"
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus.yaml"
HOST = "127.0.0.1"


class BackendError(RuntimeError):
    """A backend binary is missing or a server did not start / answer."""


def cache_bin_dir() -> Path:
    """Where build_go_tools.sh puts its binaries."""
    root = os.environ.get("TF_OTEL_CACHE") or str(Path.home() / ".cache" / "tf_otel")
    return Path(root) / "bin"


def _script_default(name: str) -> str:
    """The pinned default of `NAME=${NAME:-value}` in build_go_tools.sh (env wins, as there)."""
    if os.environ.get(name):
        return os.environ[name]
    m = re.search(rf"^{name}=\$\{{{name}:-([^}}]+)\}}", BUILD_SCRIPT.read_text(), re.M)
    if not m:
        raise BackendError(f"{BUILD_SCRIPT}: no pinned {name}")
    return m.group(1)


def jaeger_binary() -> Path:
    """The Jaeger v2 binary: $TF_OTEL_JAEGER_BIN, else the pinned build in the cache."""
    name = f"jaeger-{_script_default('JAEGER_RELEASE')}-{_script_default('JAEGER_MODULE_VERSION')}"
    return _find_binary("TF_OTEL_JAEGER_BIN", cache_bin_dir() / name, "Jaeger v2")


def collector_binary() -> Path:
    """The collector built from builder-manifest.yaml: $TF_OTEL_COLLECTOR_BIN, else the cache."""
    digest = hashlib.sha256(BUILDER_MANIFEST.read_bytes()).hexdigest()[:12]
    name = f"otelcol-tf-otel-{_script_default('OCB_VERSION')}-{digest}"
    return _find_binary("TF_OTEL_COLLECTOR_BIN", cache_bin_dir() / name, "OpenTelemetry Collector")


def prometheus_binary() -> Path:
    """Prometheus 3: $TF_OTEL_PROMETHEUS_BIN, else the pinned build in the cache."""
    name = f"prometheus-{_script_default('PROMETHEUS_RELEASE')}"
    return _find_binary("TF_OTEL_PROMETHEUS_BIN", cache_bin_dir() / name, "Prometheus")


def promtool_binary() -> Path:
    """Prometheus's promtool (rule checks, rule unit tests): $TF_OTEL_PROMTOOL_BIN, else the
    pinned build in the cache."""
    name = f"promtool-{_script_default('PROMETHEUS_RELEASE')}"
    return _find_binary("TF_OTEL_PROMTOOL_BIN", cache_bin_dir() / name, "promtool")


def _find_binary(env: str, cached: Path, what: str) -> Path:
    path = Path(os.environ[env]) if os.environ.get(env) else cached
    if not (path.is_file() and os.access(path, os.X_OK)):
        how = f"${env} points to it" if os.environ.get(env) else "it is not built"
        raise BackendError(
            f"{what} binary not found at {path} ({how}). Run `make tools` "
            f"(scripts/build_go_tools.sh) to build it, or set ${env}."
        )
    return path


def free_port() -> int:
    """A TCP port free a moment ago, never the same one twice here (tests/ports.py: outside the
    ephemeral range); start() picks again if the binary still finds one taken."""
    return free_ports()[0]


def _port_open(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET; HTTP errors are returned, connection errors raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class _Process:
    """A backend binary run in its own session, its output in a log file."""

    what = "server"

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], startup_timeout: float):
        self._argv = [str(a) for a in argv]
        # the test process's OTEL_* settings are for the code under test, not for the backend
        base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        self._env = {**base, **{k: str(v) for k, v in env.items()}}
        self._startup_timeout = startup_timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="tf_otel_backend_")
        self.log_path = Path(self._tmp.name) / "server.log"
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._ports = self._pick_ports()  # known before start: endpoints can be passed around

    # -- to be provided by subclasses
    def _pick_ports(self) -> dict[str, int]:
        """Choose free ports; returns the environment variables the config reads them from."""
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    # -- lifecycle
    def start(self) -> None:
        for attempt in range(3):
            try:
                self._start_once(repick=attempt > 0)
                return
            except BackendError as e:
                # another process took one of our free ports in between: new ports, again
                if "address already in use" not in str(e) or attempt == 2:
                    raise

    def _start_once(self, repick: bool) -> None:
        if repick:
            self._ports = self._pick_ports()
        env = {**self._env, **{k: str(v) for k, v in self._ports.items()}}
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child process
        try:
            self._proc = subprocess.Popen(
                self._argv,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code, self._proc = self._proc.returncode, None
                raise BackendError(
                    f"{self.what} exited with code {code} at start-up "
                    f"({' '.join(self._argv)}):\n{self.log_text()}"
                )
            try:
                if self._ready():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise BackendError(
            f"{self.what} not ready after {self._startup_timeout:.0f} s:\n{self.log_text()}"
        )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_text(self, tail: int = 200) -> str:
        """The last `tail` lines of the server's output."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(lines[-tail:])

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop()
        if exc_type is not None:  # show what the server said next to the failure
            sys.stderr.write(f"\n----- {self.what} log ({self.log_path}) -----\n")
            sys.stderr.write(self.log_text() + "\n")
        self._tmp.cleanup()


class _OtlpServer(_Process):
    """A backend process that receives OTLP on otlp_grpc_port / otlp_http_port."""

    otlp_grpc_port: int
    otlp_http_port: int

    @property
    def otlp_grpc_endpoint(self) -> str:
        """For OTLPSpanExporter (grpc) with insecure=True."""
        return f"http://{HOST}:{self.otlp_grpc_port}"

    @property
    def otlp_http_endpoint(self) -> str:
        """Base URL (OTEL_EXPORTER_OTLP_ENDPOINT style); traces go to /v1/traces."""
        return f"http://{HOST}:{self.otlp_http_port}"

    def _otlp_ports_open(self) -> bool:
        return all(_port_open(p) for p in (self.otlp_grpc_port, self.otlp_http_port))


class JaegerServer(_OtlpServer):
    """Jaeger v2 with in-memory storage (deploy/jaeger-v2.yaml) on free ports of 127.0.0.1."""

    what = "jaeger"

    def __init__(
        self,
        config: Path = JAEGER_CONFIG,
        binary: Optional[Path] = None,
        env: Optional[Mapping[str, str]] = None,
        startup_timeout: float = 60.0,
    ):
        binary = binary or jaeger_binary()
        env = {"JAEGER_LISTEN_HOST": HOST, **(env or {})}
        super().__init__([binary, "--config", config], env, startup_timeout)

    def _pick_ports(self) -> dict[str, int]:
        self.otlp_grpc_port = free_port()
        self.otlp_http_port = free_port()
        self.query_http_port = free_port()
        self.query_grpc_port = free_port()
        return {
            "JAEGER_OTLP_GRPC_PORT": self.otlp_grpc_port,
            "JAEGER_OTLP_HTTP_PORT": self.otlp_http_port,
            "JAEGER_QUERY_HTTP_PORT": self.query_http_port,
            "JAEGER_QUERY_GRPC_PORT": self.query_grpc_port,
        }

    # -- endpoints
    @property
    def otlp_grpc_address(self) -> str:
        """host:port, for a collector's otlp_grpc exporter."""
        return f"{HOST}:{self.otlp_grpc_port}"

    @property
    def query_url(self) -> str:
        """The UI and the HTTP query API (/api/services, /api/traces)."""
        return f"http://{HOST}:{self.query_http_port}"

    def _ready(self) -> bool:
        if not self._otlp_ports_open():
            return False
        return http_get(self.query_url + "/api/services", timeout=2)[0] == 200

    # -- query API
    def _api(self, path: str, params: Optional[Mapping[str, Any]] = None) -> tuple[int, Any]:
        url = self.query_url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        status, body = http_get(url)
        try:
            return status, json.loads(body or b"null")
        except ValueError as e:
            raise BackendError(f"GET {url}: {status}, not JSON: {body[:200]!r}") from e

    def services(self) -> list[str]:
        status, doc = self._api("/api/services")
        if status != 200:
            raise BackendError(f"/api/services: HTTP {status}: {doc}")
        return list(doc.get("data") or [])

    def traces(self, service: str, limit: int = 1000, lookback_s: float = 3600) -> list[dict]:
        """Every trace of `service` that started in the last `lookback_s` seconds."""
        now_us = int(time.time() * 1e6)
        params = {
            "service": service,
            "limit": limit,
            "start": now_us - int(lookback_s * 1e6),
            "end": now_us + 60_000_000,
        }
        status, doc = self._api("/api/traces", params)
        if status != 200:
            raise BackendError(f"/api/traces?service={service}: HTTP {status}: {doc}")
        return list(doc.get("data") or [])

    def trace(self, trace_id: str) -> Optional[dict]:
        """The trace with this (32 hex digit) id, or None if Jaeger has no such trace."""
        status, doc = self._api(f"/api/traces/{trace_id}")
        if status == 404:
            return None
        if status != 200:
            raise BackendError(f"/api/traces/{trace_id}: HTTP {status}: {doc}")
        data = doc.get("data") or []
        return data[0] if data else None

    def wait_for_trace(self, trace_id: str, min_spans: int = 1, timeout: float = 30.0) -> dict:
        """Poll until the trace has at least `min_spans` spans; BackendError on timeout."""
        deadline = time.monotonic() + timeout
        got: Optional[dict] = None
        while time.monotonic() < deadline:
            got = self.trace(trace_id)
            if got is not None and len(got.get("spans") or []) >= min_spans:
                return got
            time.sleep(0.25)
        have = len(got.get("spans") or []) if got else 0
        raise BackendError(
            f"trace {trace_id}: {have} span(s) after {timeout:.0f} s, wanted {min_spans}"
        )

    def wait_for_traces(self, service: str, count: int, timeout: float = 30.0) -> list[dict]:
        """Poll until `service` has at least `count` traces."""
        deadline = time.monotonic() + timeout
        got: list[dict] = []
        while time.monotonic() < deadline:
            got = self.traces(service)
            if len(got) >= count:
                return got
            time.sleep(0.25)
        raise BackendError(f"{service}: {len(got)} trace(s) after {timeout:.0f} s, wanted {count}")

    # -- reading a /api/traces trace
    @staticmethod
    def span_warnings(trace: Mapping[str, Any]) -> list[str]:
        """Warnings Jaeger's query adjusters attached (clock skew, missing parent, ...)."""
        out = [str(w) for w in trace.get("warnings") or []]
        for span in trace.get("spans") or []:
            out += [f"{span.get('operationName')}: {w}" for w in span.get("warnings") or []]
        return out

    @staticmethod
    def parent_id(span: Mapping[str, Any]) -> Optional[str]:
        """The spanID of the span's CHILD_OF parent, or None for a root."""
        for ref in span.get("references") or []:
            if ref.get("refType") == "CHILD_OF":
                return str(ref["spanID"])
        return None

    @staticmethod
    def tags(span: Mapping[str, Any]) -> dict[str, Any]:
        """A span's tags (its OTel attributes and more) as a dict."""
        return {t["key"]: t.get("value") for t in span.get("tags") or []}

    @staticmethod
    def process_tags(trace: Mapping[str, Any], span: Mapping[str, Any]) -> dict[str, Any]:
        """The span's process (OTel resource) tags, serviceName included."""
        proc = (trace.get("processes") or {}).get(span.get("processID"), {})
        tags = {t["key"]: t.get("value") for t in proc.get("tags") or []}
        tags["service.name"] = proc.get("serviceName")
        return tags


class CollectorServer(_OtlpServer):
    """The tf_otel collector with a config from collector-config/ on free ports of 127.0.0.1.

    The config must take OTELCOL_LISTEN_HOST, OTELCOL_OTLP_GRPC_PORT, OTELCOL_OTLP_HTTP_PORT and
    OTELCOL_HEALTH_PORT from the environment (all configs in collector-config/ do); `env` adds
    more (exporter endpoints, tail-sampling timings).
    """

    what = "collector"

    def __init__(
        self,
        config: Path,
        env: Optional[Mapping[str, str]] = None,
        binary: Optional[Path] = None,
        startup_timeout: float = 60.0,
        overrides: Sequence[str] = (),
    ):
        """overrides: extra `--config` values merged over the file, e.g.
        "yaml:service::pipelines::logs::exporters: [file/logs]"."""
        self.config = Path(config)
        if not self.config.is_file():
            raise BackendError(f"collector config {self.config} does not exist")
        binary = binary or collector_binary()
        env = {"OTELCOL_LISTEN_HOST": HOST, **(env or {})}
        argv: list[Any] = [binary, "--config", self.config]
        for override in overrides:
            argv += ["--config", override]
        super().__init__(argv, env, startup_timeout)

    def _pick_ports(self) -> dict[str, int]:
        self.otlp_grpc_port = free_port()
        self.otlp_http_port = free_port()
        self.health_port = free_port()
        return {
            "OTELCOL_OTLP_GRPC_PORT": self.otlp_grpc_port,
            "OTELCOL_OTLP_HTTP_PORT": self.otlp_http_port,
            "OTELCOL_HEALTH_PORT": self.health_port,
        }

    def _ready(self) -> bool:
        if not self._otlp_ports_open():
            return False
        return http_get(f"http://{HOST}:{self.health_port}/", timeout=2)[0] == 200


def validate_collector_config(
    config: Path, env: Optional[Mapping[str, str]] = None
) -> subprocess.CompletedProcess[str]:
    """Run `<collector> validate --config <config>`; the caller checks returncode/output."""
    return subprocess.run(
        [str(collector_binary()), "validate", "--config", str(config)],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


class PrometheusServer(_Process):
    """Prometheus 3 with deploy/prometheus.yaml on a free port of 127.0.0.1, started with the
    flags docker-compose.yml gives it (OTLP receiver, exemplar storage), its TSDB in a temporary
    directory."""

    what = "prometheus"

    def __init__(
        self,
        config: Path = PROMETHEUS_CONFIG,
        binary: Optional[Path] = None,
        startup_timeout: float = 60.0,
    ):
        binary = binary or prometheus_binary()
        self._base_argv = [
            str(binary),
            f"--config.file={config}",
            "--web.enable-otlp-receiver",
            "--enable-feature=exemplar-storage",
        ]
        super().__init__(self._base_argv, {}, startup_timeout)

    def _pick_ports(self) -> dict[str, int]:
        # Prometheus takes its address and storage as flags: rebuild argv with the new port
        self.port = free_port()
        self._argv = [
            *self._base_argv,
            f"--web.listen-address={HOST}:{self.port}",
            f"--storage.tsdb.path={Path(self._tmp.name) / 'data'}",
        ]
        return {}

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def otlp_metrics_url(self) -> str:
        """For an otlphttp exporter's metrics_endpoint."""
        return self.url + "/api/v1/otlp/v1/metrics"

    def _ready(self) -> bool:
        return http_get(self.url + "/-/ready", timeout=2)[0] == 200

    def api(self, path: str, params: Optional[Mapping[str, Any]] = None) -> dict:
        """GET /api/v1/<path>; the JSON answer, whatever its status (the caller checks it)."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        status, body = http_get(url, timeout=30)
        try:
            doc = json.loads(body or b"null")
        except ValueError as e:
            raise BackendError(f"GET {url}: {status}, not JSON: {body[:200]!r}") from e
        if not isinstance(doc, dict):
            raise BackendError(f"GET {url}: {status}: {doc!r}")
        return doc

    def metric_names(self) -> list[str]:
        doc = self.api("label/__name__/values")
        if doc.get("status") != "success":
            raise BackendError(f"label values: {doc}")
        return list(doc.get("data") or [])

    def query(self, expr: str) -> dict:
        """An instant query now: {"status", "data": {"resultType", "result"}} or the error."""
        return self.api("query", {"query": expr})

    def parse_query(self, expr: str) -> dict:
        """Prometheus's own PromQL parser (/api/v1/parse_query): the expression's AST as JSON."""
        return self.api("parse_query", {"query": expr})

    def exemplars(self, expr: str, lookback_s: float = 3600) -> list[dict]:
        """/api/v1/query_exemplars over the last `lookback_s` seconds: one entry per series."""
        now = time.time()
        doc = self.api(
            "query_exemplars", {"query": expr, "start": now - lookback_s, "end": now + 60}
        )
        if doc.get("status") != "success":
            raise BackendError(f"query_exemplars {expr}: {doc}")
        return list(doc.get("data") or [])


def collector_log_records(path: Path) -> list[dict[str, Any]]:
    """The log records a collector's file exporter (format: json) wrote to `path`: one dict per
    record with its body, trace id and its resource's attributes, flattened to plain values."""
    from tf_otel.analysis.otlp_values import any_value, attributes_dict

    records: list[dict[str, Any]] = []
    if not path.exists():
        return records
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        for resource_logs in json.loads(line).get("resourceLogs", []):
            resource = attributes_dict(resource_logs.get("resource", {}).get("attributes"))
            for scope_logs in resource_logs.get("scopeLogs", []):
                for record in scope_logs.get("logRecords", []):
                    records.append(
                        {
                            "body": any_value(record.get("body", {})),
                            "trace_id": record.get("traceId", ""),
                            "severity": record.get("severityText", ""),
                            "resource": resource,
                        }
                    )
    return records
