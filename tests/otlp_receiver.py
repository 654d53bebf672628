"""A real OTLP trace receiver for tests: gRPC (TraceService/Export) and HTTP (POST /v1/traces,
protobuf or JSON, optionally gzip), built on opentelemetry-proto, bound to 127.0.0.1. Metrics
(MetricsService, /v1/metrics) and logs (LogsService, /v1/logs) are received the same way.

Usage::

    with OtlpReceiver() as receiver:
        env = receiver.env("grpc")   # OTEL_EXPORTER_OTLP_* for a subprocess
        ...
        spans = receiver.wait_for(lambda spans: len(spans) >= 10)
"""

from __future__ import annotations

import gzip
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Tuple

import grpc
from google.protobuf.json_format import Parse
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


@dataclass
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_id: Optional[str]
    name: str
    start_ns: int
    end_ns: int
    attributes: Dict[str, Any]
    resource: Dict[str, Any]
    links: List[str] = field(default_factory=list)  # linked span ids
    status_code: int = 0

    @property
    def category(self) -> Optional[str]:
        return self.attributes.get("tf_otel.category")

    @property
    def rank(self) -> Optional[int]:
        return self.attributes.get("tf_otel.rank")


def spans_of(request: trace_service_pb2.ExportTraceServiceRequest) -> List[ReceivedSpan]:
    result = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: any_value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                result.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex() or None,
                        name=span.name,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes={kv.key: any_value(kv.value) for kv in span.attributes},
                        resource=resource,
                        links=[link.span_id.hex() for link in span.links],
                        status_code=span.status.code,
                    )
                )
    return result


@dataclass
class ReceivedPoint:
    """One metric data point (sum, gauge or histogram) as it arrived."""

    name: str
    attributes: Dict[str, Any]
    resource: Dict[str, Any]
    value: Any  # number; for a histogram: (count, sum)
    exemplar_trace_ids: List[str] = field(default_factory=list)
    # (trace id hex, span id hex, value) of each exemplar; a histogram's bucket counts / bounds
    exemplars: List[Tuple[str, str, float]] = field(default_factory=list)
    bucket_counts: List[int] = field(default_factory=list)
    explicit_bounds: List[float] = field(default_factory=list)


def points_of(request: metrics_service_pb2.ExportMetricsServiceRequest) -> List[ReceivedPoint]:
    out = []
    for rm in request.resource_metrics:
        resource = {kv.key: any_value(kv.value) for kv in rm.resource.attributes}
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                for p in getattr(metric, kind).data_points:
                    attrs = {kv.key: any_value(kv.value) for kv in p.attributes}
                    if kind in ("histogram", "exponential_histogram"):
                        value: Any = (p.count, p.sum)
                    else:
                        value = p.as_int if p.WhichOneof("value") == "as_int" else p.as_double
                    exemplars = [e.trace_id.hex() for e in getattr(p, "exemplars", ())]
                    point = ReceivedPoint(metric.name, attrs, resource, value, exemplars)
                    for e in getattr(p, "exemplars", ()):
                        number = e.as_int if e.WhichOneof("value") == "as_int" else e.as_double
                        point.exemplars.append((e.trace_id.hex(), e.span_id.hex(), number))
                    if kind == "histogram":
                        point.bucket_counts = list(p.bucket_counts)
                        point.explicit_bounds = list(p.explicit_bounds)
                    out.append(point)
    return out


@dataclass
class ReceivedLog:
    """One OTLP log record as it arrived (ids in hex, "" when the record had none)."""

    body: Any
    trace_id: str
    span_id: str
    flags: int
    severity: str
    attributes: Dict[str, Any]
    resource: Dict[str, Any]


def logs_of(request: logs_service_pb2.ExportLogsServiceRequest) -> List[ReceivedLog]:
    out = []
    for rl in request.resource_logs:
        resource = {kv.key: any_value(kv.value) for kv in rl.resource.attributes}
        for sl in rl.scope_logs:
            for log in sl.log_records:
                out.append(
                    ReceivedLog(
                        body=any_value(log.body),
                        trace_id=log.trace_id.hex(),
                        span_id=log.span_id.hex(),
                        flags=log.flags,
                        severity=log.severity_text,
                        attributes={kv.key: any_value(kv.value) for kv in log.attributes},
                        resource=resource,
                    )
                )
    return out


class OtlpReceiver:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host  # e.g. a simulated cluster's bridge address (tests/cluster/sim.py)
        self._spans: List[ReceivedSpan] = []
        self._points: List[ReceivedPoint] = []
        self._logs: List[ReceivedLog] = []
        self._lock = threading.Lock()
        self.requests = {"grpc": 0, "http": 0}
        self._grpc: Any = None
        self._http: Optional[ThreadingHTTPServer] = None

    # -- servers -----------------------------------------------------------------------
    def _add(self, request: trace_service_pb2.ExportTraceServiceRequest, transport: str) -> None:
        spans = spans_of(request)
        with self._lock:
            self._spans.extend(spans)
            self.requests[transport] += 1

    def _add_points(self, request: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        points = points_of(request)
        with self._lock:
            self._points.extend(points)

    def _add_logs(self, request: logs_service_pb2.ExportLogsServiceRequest) -> None:
        logs = logs_of(request)
        with self._lock:
            self._logs.extend(logs)

    def logs(self) -> List[ReceivedLog]:
        with self._lock:
            return list(self._logs)

    def wait_for_logs(
        self, predicate: Callable[[List[ReceivedLog]], Any], timeout_s: float = 15.0
    ) -> List[ReceivedLog]:
        deadline = time.monotonic() + timeout_s
        while True:
            logs = self.logs()
            if predicate(logs) or time.monotonic() > deadline:
                return logs
            time.sleep(0.05)

    def points(self) -> List[ReceivedPoint]:
        with self._lock:
            return list(self._points)

    def wait_for_points(
        self, predicate: Callable[[List[ReceivedPoint]], Any], timeout_s: float = 15.0
    ) -> List[ReceivedPoint]:
        deadline = time.monotonic() + timeout_s
        while True:
            points = self.points()
            if predicate(points) or time.monotonic() > deadline:
                return points
            time.sleep(0.05)

    def start(self) -> OtlpReceiver:
        receiver = self

        class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
                receiver._add(request, "grpc")
                return trace_service_pb2.ExportTraceServiceResponse()

        class MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
                receiver._add_points(request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        class LogsService(logs_service_pb2_grpc.LogsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
                receiver._add_logs(request)
                return logs_service_pb2.ExportLogsServiceResponse()

        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(LogsService(), self._grpc)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), self._grpc)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(MetricsService(), self._grpc)
        self.grpc_port = self._grpc.add_insecure_port(f"{self.host}:0")
        self._grpc.start()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/logs":
                    logs = logs_service_pb2.ExportLogsServiceRequest()
                    if "json" in (self.headers.get("Content-Type") or ""):
                        Parse(body.decode(), logs)
                    else:
                        logs.ParseFromString(body)
                    receiver._add_logs(logs)
                    answer = logs_service_pb2.ExportLogsServiceResponse().SerializeToString()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                    return
                if self.path == "/v1/metrics":
                    metrics = metrics_service_pb2.ExportMetricsServiceRequest()
                    if "json" in (self.headers.get("Content-Type") or ""):
                        Parse(body.decode(), metrics)
                    else:
                        metrics.ParseFromString(body)
                    receiver._add_points(metrics)
                    reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                if "json" in (self.headers.get("Content-Type") or ""):
                    Parse(body.decode(), request)
                else:
                    request.ParseFromString(body)
                receiver._add(request, "http")
                payload = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer((self.host, 0), Handler)
        self.http_port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(0)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- queries -----------------------------------------------------------------------
    def env(self, protocol: str = "grpc") -> Dict[str, str]:
        """OTEL_* variables that send a subprocess's traces here."""
        if protocol == "grpc":
            endpoint = f"http://{self.host}:{self.grpc_port}"
            wire = "grpc"
        else:
            endpoint = f"http://{self.host}:{self.http_port}"
            wire = "http/protobuf"
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": wire,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_BLRP_SCHEDULE_DELAY": "200",
        }

    def spans(self) -> List[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def wait_for(
        self, predicate: Callable[[List[ReceivedSpan]], bool], timeout_s: float = 15.0
    ) -> List[ReceivedSpan]:
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if predicate(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.05)


class HangingCollector:
    """Accepts connections and never answers (a wedged collector or a black-holing proxy), on
    127.0.0.1. ``conns``: the connections it holds open."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: List[Any] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)  # held open, never read or answered

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for conn in self.conns:
            conn.close()
