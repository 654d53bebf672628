"""OpenTelemetry SDK set-up: from OTEL_* the way ``opentelemetry-instrument`` does it, plus the
OTLP-JSON file exporter (``TF_OTEL_FILE``) and quieting of exporters that cannot reach a collector.

Usage::

    configure_from_env(settings)    # no-op when the process already set a TracerProvider
    add_file_exporter("spans.jsonl")
"""

from __future__ import annotations

import base64
import contextlib
import errno
import functools
import json
import logging
import os
import threading
from typing import IO, Any, Callable, Dict, Optional, Sequence, cast

from tf_otel.config import Settings
from tf_otel.health import count, fail_open, first_time, log_once
from tf_otel.stderr_once import EXPORTER_LOGGERS

# the file's batch processor writes at least this often (TF_OTEL_FILE_FLUSH_S; config.py)
FILE_FLUSH_S = 0.5

_configured_here = False


def provider_is_configured() -> bool:
    from opentelemetry import trace
    from opentelemetry.trace import ProxyTracerProvider

    return not isinstance(trace.get_tracer_provider(), ProxyTracerProvider)


def configure_from_env(settings: Settings) -> bool:
    """Configure the SDK from OTEL_* unless a TracerProvider is already set. True if we did.
    ``settings``: those instrument() read (the job id and attempt of the rank's resource)."""
    global _configured_here
    if provider_is_configured():
        return False
    # opentelemetry-instrument's defaults: metrics on (step histograms, health, host), logs
    # only when asked for, since a program's whole logging would otherwise leave the process.
    os.environ.setdefault("OTEL_METRICS_EXPORTER", "otlp")
    os.environ.setdefault("OTEL_LOGS_EXPORTER", "none")
    from opentelemetry.distro import OpenTelemetryConfigurator, OpenTelemetryDistro

    OpenTelemetryDistro().configure()
    OpenTelemetryConfigurator().configure()
    _configured_here = provider_is_configured()
    if _configured_here:
        with fail_open("sdk.resource"):  # the rank's resource from the first span / log record
            from tf_otel.job.topology import detect

            merge_topology_resource(detect(job_id=settings.job_id, attempt=settings.attempt))
        with fail_open("sdk.logs"):
            setup_logs()
    return _configured_here


def setup_logs() -> bool:
    """Python logging -> OTLP logs when OTEL_LOGS_EXPORTER names an exporter, the way
    ``opentelemetry-instrument`` does with opentelemetry-instrumentation-logging installed: its
    LoggingInstrumentor adds the handler (OTEL_PYTHON_LOG_AUTO_INSTRUMENTATION,
    OTEL_PYTHON_LOG_HANDLER_LEVEL) and, with OTEL_PYTHON_LOG_CORRELATION=true, puts otelTraceID /
    otelSpanID / otelTraceSampled on every LogRecord. With the SDK's own (deprecated) handler
    switched on (OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED=true) the configurator has
    already added it. True if a handler or the record ids were set up here."""
    exporters = {
        name.strip().lower() for name in os.environ.get("OTEL_LOGS_EXPORTER", "").split(",")
    } - {"", "none"}
    correlation = os.environ.get("OTEL_PYTHON_LOG_CORRELATION", "").strip().lower() == "true"
    sdk_handler = (
        os.environ.get("OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED", "").strip().lower()
        == "true"
    )
    if not exporters and not correlation:
        return False
    try:
        from opentelemetry.instrumentation.logging import LoggingInstrumentor
    except ImportError:
        if not exporters or sdk_handler:
            return False
        from opentelemetry._logs import get_logger_provider
        from opentelemetry.sdk._logs import LoggingHandler

        logging.getLogger().addHandler(LoggingHandler(logger_provider=get_logger_provider()))
        return True
    options: Dict[str, Any] = {} if exporters else {"enable_log_auto_instrumentation": False}
    LoggingInstrumentor().instrument(**options)
    return True


_meter_provider: Any = None  # instrument(meter_provider=...): else the global one


def use_meter_provider(provider: Any) -> None:
    """The MeterProvider tf_otel's metrics go to, as the contrib instrumentations take one."""
    global _meter_provider
    _meter_provider = provider


def sdk_meter_provider() -> Optional[Any]:
    """The process's MeterProvider (the one given to instrument(), else the global one) when it
    is a real one (an SDK's), else None."""
    from opentelemetry import metrics

    provider = _meter_provider or metrics.get_meter_provider()
    if type(provider).__name__ in ("NoOpMeterProvider", "_ProxyMeterProvider"):
        return None
    return provider


def configured_here() -> bool:
    return _configured_here


class _ExportFailureFilter(logging.Filter):
    """Let the first export failure of each logger through, count the rest."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if str(record.msg).startswith("Queue full"):  # a drop, not a failing collector
            count("sdk_queue_full")
            if not first_time("export:queue_full"):
                return False
            record.msg = (
                "tf_otel: the SDK's span queue is full; spans are dropped and counted "
                "(raise OTEL_BSP_MAX_QUEUE_SIZE). First: " + str(record.msg)
            )
            return True
        count("export_errors")
        kind = _signal(record)
        if not first_time(f"export:{record.name}:{kind}"):
            return False
        record.msg = (
            f"tf_otel: {kind} export is failing; training goes on. First error: {record.msg}"
        )
        return True


def _signal(record: logging.LogRecord) -> str:
    """Which signal a failing export carries (one exporter logger serves spans, metrics and
    logs): named in the SDK's message ("... while exporting metrics to ...")."""
    try:
        message = record.getMessage()
    except Exception:  # a malformed record: still one line
        message = str(record.msg)
    for word, kind in (("metric", "metric"), ("log", "log"), ("span", "span"), ("trace", "span")):
        if f"exporting {word}" in message:
            return kind
    return "span"


def quiet_exporter_logs() -> None:
    """One log line per exporter when a collector is missing or hangs, not one per retry."""
    flt = _ExportFailureFilter()
    for name in EXPORTER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _ExportFailureFilter) for f in logger.filters):
            logger.addFilter(flt)


def _hex_ids(node: Any) -> Any:
    """protobuf's JSON writes bytes as base64; OTLP/JSON wants trace and span ids in hex."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)
    return node


def spans_to_otlp_json(spans: Sequence[Any]) -> Dict[str, Any]:
    """ReadableSpans -> one OTLP/JSON ``TracesData`` object: written directly (otel.otlp_json,
    ~4x less CPU), through protobuf for values that encoder leaves to it (same output)."""
    from tf_otel.otel import otlp_json

    try:
        return otlp_json.traces_data(spans)
    except otlp_json.Unsupported:
        return proto_otlp_json(spans)


def proto_otlp_json(spans: Sequence[Any]) -> Dict[str, Any]:
    """ReadableSpans -> OTLP/JSON through the OTLP protobuf encoder and MessageToDict."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    message = encode_spans(spans)
    return _hex_ids(MessageToDict(message, use_integers_for_enums=True))


class OtlpJsonFileExporter:
    """Writes one OTLP/JSON TracesData per line (the Collector file exporter format).

    Bounded: past ``max_bytes`` the file is rotated (``spans.jsonl`` -> ``spans.1.jsonl`` ...,
    ``keep`` old files, the oldest removed), so the files stay readable by ``tf-otel analyze``.
    A file that cannot be opened is reported at start; a full disk stops writing (the partial
    line is cut off), is counted and said once — training goes on."""

    def __init__(
        self,
        path: str,
        max_bytes: int = 0,
        keep: int = 0,
        path_of: Optional[Callable[[], str]] = None,
    ) -> None:
        self.path = path
        # names the file at its first spans instead (the rank may be learned after start-up,
        # from the program's own tf.distribute.Server); until then ``path`` is only checked
        self._path_of = path_of
        self.max_bytes = max_bytes  # 0: no cap
        self.keep = keep
        self._lock = threading.Lock()
        self._file: Optional[IO[bytes]] = None
        self._size = 0
        self._stopped = False

    def open(self) -> bool:
        """Open (create) the file now; False with one clear message if it cannot be written.
        A file named at its first spans (``path_of``): its directory is checked now."""
        with self._lock:
            if self._path_of is not None:
                return self._check_directory()
            return self._open()

    def _check_directory(self) -> bool:
        try:
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
            if not os.access(directory, os.W_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), directory)
            return True
        except OSError as exc:
            self._cannot_write(exc)
            return False

    def _open(self) -> bool:
        try:
            if self._path_of is not None:
                self.path, self._path_of = self._path_of(), None
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
            # unbuffered: a write cut short by a full disk leaves no bytes in a buffer that a
            # later flush or close would append after the cut is truncated away
            self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115
            self._size = self._file.tell()
            if self._size and not _ends_a_line(self.path):
                # an earlier process was killed while writing its last record: ours start on
                # a line of their own, so the analysis skips only that record (its cut end)
                self._file.write(b"\n")
                self._size += 1
            return True
        except OSError as exc:
            self._cannot_write(exc)
            return False

    def _cannot_write(self, exc: OSError) -> None:
        self._stop(
            "file_open_errors",
            "tf_otel: TF_OTEL_FILE=%r cannot be written (%s); no spans go to a file, "
            "other exporters are unaffected",
            exc,
        )

    def _stop(self, key: str, message: str, exc: OSError) -> None:
        self._stopped = True
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        log_once(key, message, self.path, f"{type(exc).__name__}: {exc.strerror or exc}")

    def _rotate(self) -> None:
        assert self._file is not None
        self._file.close()
        self._file = None
        stem, suffix = os.path.splitext(self.path)
        older = [f"{stem}.{n}{suffix}" for n in range(1, self.keep + 1)]
        if older:
            with contextlib.suppress(FileNotFoundError):
                os.remove(older[-1])
            for src, dst in zip(reversed(older[:-1]), reversed(older[1:])):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(src, dst)
            os.replace(self.path, older[0])
        else:
            os.remove(self.path)
        count("file_rotations")
        self._open()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if self._stopped:
            return SpanExportResult.FAILURE
        try:
            line = json.dumps(spans_to_otlp_json(spans), separators=(",", ":")).encode() + b"\n"
        except Exception as exc:  # noqa: BLE001
            log_once("file_encode", "tf_otel: cannot encode spans for TF_OTEL_FILE (%s)", exc)
            return SpanExportResult.FAILURE
        with self._lock:
            if self._file is None and (self._stopped or not self._open()):
                return SpanExportResult.FAILURE
            assert self._file is not None
            try:
                if self.max_bytes and self._size and self._size + len(line) > self.max_bytes:
                    self._rotate()
                    if self._file is None:
                        return SpanExportResult.FAILURE
                start = self._size
                try:
                    view = memoryview(line)
                    while view:  # a raw write may take part of the line
                        written = self._file.write(view)
                        if not written:
                            raise OSError(errno.EIO, "the span file took no bytes")
                        view = view[written:]
                except OSError:
                    with contextlib.suppress(OSError):  # no half line for the analysis to trip on
                        self._file.truncate(start)
                    raise
                self._size += len(line)
                return SpanExportResult.SUCCESS
            except OSError as exc:
                full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
                self._stop(
                    "file_disk_full" if full else "file_write_errors",
                    "tf_otel: TF_OTEL_FILE=%r: writing stopped (%s); later spans for it are "
                    "counted as lost, training goes on",
                    exc,
                )
                return SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None


def _ends_a_line(path: str) -> bool:
    """Whether the file's last byte ends a line (an empty file does)."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        if not handle.tell():
            return True
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


def file_path_for_rank(template: str) -> str:
    """TF_OTEL_FILE may hold ``{rank}``, ``{host}`` or ``{pid}``: one file per rank."""
    if "{" not in template:
        return template
    import socket

    from tf_otel.job.topology import detect

    try:
        return template.format(rank=detect().rank, host=socket.gethostname(), pid=os.getpid())
    except (KeyError, IndexError, ValueError) as exc:
        log_once(
            "file_template", "tf_otel: TF_OTEL_FILE=%r is not a valid template (%s)", template, exc
        )
        return template


def rank_known_later(template: str) -> bool:
    """``{rank}`` in TF_OTEL_FILE while the environment names no launcher and no TF_CONFIG: the
    rank may still come from the cluster the program gives its tf.distribute.Server
    (job/topology.py), so the file is named at its first spans (after the first step)."""
    if "{rank" not in template:
        return False
    from tf_otel.job.topology import detect

    return detect().launcher == "none"


def add_file_exporter(
    path: str,
    max_bytes: int = 0,
    keep: int = 0,
    provider: Any = None,
    template: Optional[str] = None,
    flush_s: float = FILE_FLUSH_S,
) -> bool:
    """Add a batch processor writing OTLP-JSON to ``path`` on ``provider`` (default: the global
    SDK TracerProvider); the file is opened now, so a path that cannot be written is said at
    start. With ``template`` (TF_OTEL_FILE whose ``{rank}`` may be learned later,
    ``rank_known_later``) the file is named from it at its first spans; ``path`` (the template
    as it reads now) has its directory checked at start. ``flush_s``: the processor writes
    what it holds at least this often (``TF_OTEL_FILE_FLUSH_S``, or the shorter
    ``OTEL_BSP_SCHEDULE_DELAY``), so a process killed by
    SIGKILL loses about that much and the export thread's half second; the SDK's default, 5 s,
    lost a short job's whole run. Its queue stays the SDK's (bounded: 2,048 spans, the rest
    dropped and counted); the writes happen on its own thread, never the training thread's."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    provider = provider or trace.get_tracer_provider()
    if not hasattr(provider, "add_span_processor"):
        log_once("file_export_provider", "tf_otel: TF_OTEL_FILE needs the OpenTelemetry SDK")
        return False
    path_of = None if template is None else functools.partial(file_path_for_rank, template)
    exporter = OtlpJsonFileExporter(path, max_bytes=max_bytes, keep=keep, path_of=path_of)
    if not exporter.open():
        return False
    # duck-typed SpanExporter (export / shutdown / force_flush): the SDK is imported lazily
    delay_ms = max(1, round(flush_s * 1000))
    with contextlib.suppress(ValueError):  # a shorter OTEL_BSP_SCHEDULE_DELAY is kept
        delay_ms = min(delay_ms, max(1, int(os.environ.get("OTEL_BSP_SCHEDULE_DELAY", ""))))
    processor = BatchSpanProcessor(cast(SpanExporter, exporter), schedule_delay_millis=delay_ms)
    provider.add_span_processor(processor)
    return True


def service_name_default() -> str:
    import sys

    script = os.path.basename(sys.argv[0]) if getattr(sys, "argv", None) and sys.argv[0] else ""
    return os.path.splitext(script)[0] or "python"


def merge_resource(provider: Any, attributes: Dict[str, Any]) -> None:
    """Add job topology to the SDK provider's resource (tracer or logger provider); name the
    service after the script when OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES did not."""
    from opentelemetry.sdk.resources import Resource

    current = getattr(provider, "_resource", None)
    if current is None:
        return
    extra = dict(attributes)
    if str(current.attributes.get("service.name", "")).startswith("unknown_service"):
        extra["service.name"] = service_name_default()
    update = getattr(provider, "_update_resource", None)
    if update is not None:  # recent SDKs: tracers / loggers made before now get it too
        update(Resource(extra))
    else:
        provider._resource = current.merge(Resource(extra))


def topology_resource(topology: Any) -> Dict[str, Any]:
    """The rank's resource attributes (docs/ARCHITECTURE.md, Attributes)."""
    from tf_otel import record

    attributes = {
        "host.name": topology.host,
        "process.pid": os.getpid(),
        record.ATTR_RANK: topology.rank,
        record.ATTR_WORLD_SIZE: topology.world_size,
        record.ATTR_STEP_WORLD_SIZE: topology.step_world_size,
        record.ATTR_LOCAL_RANK: topology.local_rank,
        record.ATTR_JOB_ID: topology.job_id,
        record.ATTR_LAUNCHER: topology.launcher,
    }
    if getattr(topology, "attempt", ""):  # one launch: the analysis keeps attempts apart
        attributes[record.ATTR_JOB_ATTEMPT] = topology.attempt
    return attributes


def merge_topology_resource(topology: Any, tracer_provider: Any = None) -> None:
    """The rank's resource on the tracer provider and on the logger provider (OTLP logs)."""
    from opentelemetry import trace
    from opentelemetry._logs import get_logger_provider

    attributes = topology_resource(topology)
    merge_resource(tracer_provider or trace.get_tracer_provider(), attributes)
    merge_resource(get_logger_provider(), attributes)


def _batch_processors(provider: Any) -> list:
    multi = getattr(provider, "_active_span_processor", None)
    processors = list(getattr(multi, "_span_processors", ()) or ())
    # local files first: a missing collector must not cost the OTLP-JSON file its last spans
    processors.sort(key=lambda p: not isinstance(_exporter_of(p), OtlpJsonFileExporter))
    return processors


def _exporter_of(processor: Any) -> Any:
    from tf_otel.otel.delivery import inner_exporter

    exporter = inner_exporter(processor)
    return getattr(exporter, "inner", exporter)  # under delivery's counting wrapper


def _abandon(processor: Any) -> None:
    """Stop a batch processor without waiting: its worker is a daemon thread."""
    inner = getattr(processor, "_batch_processor", None)
    if inner is not None:
        inner._shutdown = True
        inner._shutdown_timeout_exceeded = True
        inner._worker_awaken.set()
    exporter = _exporter_of(processor)
    if exporter is not None:
        exporter.shutdown()


def bounded_flush(provider: Any, timeout_s: float) -> bool:
    """Flush every span processor within timeout_s in all. A processor whose exporter is failing
    (no collector) or too slow (a hanging one) is abandoned, so the job's exit is never held."""
    import time

    from tf_otel.health import counters

    if counters["export_errors"]:
        timeout_s = min(timeout_s, 0.5)  # the collector already failed once: do not wait long
    deadline = time.monotonic() + timeout_s
    all_done = True
    for processor in _batch_processors(provider):
        done = threading.Event()
        errors_before = counters["export_errors"]

        def flush(p: Any = processor, event: threading.Event = done) -> None:
            try:
                p.force_flush(int(timeout_s * 1000))
            finally:
                event.set()

        threading.Thread(target=flush, name="tf_otel-flush", daemon=True).start()
        while not done.wait(0.05):
            if time.monotonic() > deadline or counters["export_errors"] > errors_before:
                break
        if not done.is_set() or counters["export_errors"] > errors_before:
            all_done = False
            count("exit_flush_abandoned")
            try:
                _abandon(processor)
            except Exception as exc:  # noqa: BLE001
                log_once("abandon", "tf_otel: cannot stop a span exporter (%s)", exc)
    return all_done
