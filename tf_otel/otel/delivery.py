"""Delivery accounting: every span tf_otel's process ends is either confirmed by each exporter or
counted as lost, by cause, and said in one line at exit.

A counting wrapper sits around the exporter of each span processor (the SDK's BatchSpanProcessor
hides its drops in a log line), and a processor counts the spans that ended. Per exporter:

    lost = ended - exported - still queued or in flight
         = export failed (the exporter said no) + queue full (dropped by the SDK's queue)
           + left at exit (still queued / in flight when the bounded exit flush gave up)

Usage::

    watch(provider)           # once, after every span processor is added
    ...
    report_at_exit()          # after the exit flush: one WARNING line if anything was lost
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from opentelemetry.sdk.trace import SpanProcessor

from tf_otel.health import counters, logger


class CountingExporter:
    """Wraps a span exporter; counts spans it confirmed, spans it failed and what is in flight."""

    def __init__(self, inner: Any, label: str) -> None:
        self.inner = inner
        self.label = label
        self.exported = 0
        self.failed = 0
        self.failed_calls = 0
        self.in_flight = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        n = len(spans)
        with self._lock:
            self.in_flight += n
        ok = False
        try:
            result = self.inner.export(spans)
            ok = result == SpanExportResult.SUCCESS
            return result
        finally:  # an exception is a failure too; the SDK logs it
            with self._lock:
                self.in_flight -= n
                if ok:
                    self.exported += n
                else:
                    self.failed += n
                    self.failed_calls += 1

    def shutdown(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.shutdown(*args, **kwargs)

    def force_flush(self, timeout_millis: int = 30000) -> Any:
        flush = getattr(self.inner, "force_flush", None)
        return flush(timeout_millis) if flush is not None else True

    def __getattr__(self, name: str) -> Any:  # endpoint, timeouts ... of the real exporter
        return getattr(self.inner, name)


class _EndCounter(SpanProcessor):
    """A span processor that only counts ended spans (the denominator of every loss)."""

    def __init__(self) -> None:
        self.ended = 0
        self._lock = threading.Lock()

    def on_end(self, span: Any) -> None:
        with self._lock:
            self.ended += 1


@dataclass
class ExporterLoss:
    label: str
    ended: int
    exported: int
    failed: int
    queued: int  # still in the SDK queue or in flight: lost if this is the exit
    queue_full: int

    @property
    def lost(self) -> int:
        return self.failed + self.queued + self.queue_full


_counter: Optional[_EndCounter] = None
_watched: List[tuple] = []  # (processor, CountingExporter)
_watch_lock = threading.Lock()


def _label(exporter: Any) -> str:
    name = type(exporter).__name__
    where = getattr(exporter, "_endpoint", None) or getattr(exporter, "path", None)
    return f"{name}({where})" if where else name


def inner_exporter(processor: Any) -> Any:
    """The exporter a span processor sends to (BatchSpanProcessor or SimpleSpanProcessor)."""
    batch = getattr(processor, "_batch_processor", None)
    return getattr(batch, "_exporter", None) or getattr(processor, "span_exporter", None)


def _set_exporter(processor: Any, exporter: Any) -> bool:
    batch = getattr(processor, "_batch_processor", None)
    if batch is not None and hasattr(batch, "_exporter"):
        batch._exporter = exporter
        return True
    if hasattr(processor, "span_exporter"):
        processor.span_exporter = exporter
        return True
    return False


def _processors(provider: Any) -> list:
    multi = getattr(provider, "_active_span_processor", None)
    return list(getattr(multi, "_span_processors", ()) or ())


def watch(provider: Any) -> None:
    """Count ended spans on ``provider`` and wrap the exporter of each of its span processors.
    Idempotent: processors already watched are left alone, new ones are added."""
    global _counter
    if not hasattr(provider, "add_span_processor"):
        return
    with _watch_lock:
        if _counter is None:
            _counter = _EndCounter()
            provider.add_span_processor(_counter)
        for processor in _processors(provider):
            exporter = inner_exporter(processor)
            if exporter is None or isinstance(exporter, CountingExporter):
                continue
            wrapped = CountingExporter(exporter, _label(exporter))
            if _set_exporter(processor, wrapped):
                _watched.append((processor, wrapped))


def _queued(processor: Any) -> int:
    queue = getattr(getattr(processor, "_batch_processor", None), "_queue", None)
    try:
        return len(queue) if queue is not None else 0
    except TypeError:
        return 0


def losses() -> List[ExporterLoss]:
    """The delivery state of every watched exporter, now."""
    ended = _counter.ended if _counter is not None else 0
    out = []
    for processor, exporter in list(_watched):
        queued = _queued(processor) + exporter.in_flight
        accounted = exporter.exported + exporter.failed + queued
        out.append(
            ExporterLoss(
                label=exporter.label,
                ended=ended,
                exported=exporter.exported,
                failed=exporter.failed,
                queued=queued,
                queue_full=max(0, ended - accounted),
            )
        )
    return out


def ended_spans() -> int:
    return _counter.ended if _counter is not None else 0


def summary(waited_s: Optional[float] = None) -> Optional[str]:
    """One line naming every loss at exit, or None when nothing was lost."""
    parts = []
    limit = f" (TF_OTEL_EXIT_TIMEOUT_S={waited_s:g})" if waited_s is not None else ""
    for loss in losses():
        if not loss.lost:
            continue
        causes = []
        if loss.failed:
            causes.append(f"{loss.failed:,} export failed")
        if loss.queue_full:
            causes.append(f"{loss.queue_full:,} dropped from the full export queue")
        if loss.queued:
            causes.append(f"{loss.queued:,} unsent when the exit flush gave up{limit}")
        parts.append(f"{loss.label}: {loss.lost:,} of {loss.ended:,} lost ({', '.join(causes)})")
    steps = counters.get("steps_dropped", 0)
    if steps:
        parts.append(f"{steps:,} sampled steps dropped from tf_otel's full step queue")
    if counters.get("file_disk_full", 0) or counters.get("file_write_errors", 0):
        parts.append("the span file stopped: see the earlier message")
    if not parts:
        return None
    return "tf_otel: spans were lost: " + "; ".join(parts) + " (docs/guides/RELIABILITY.md)"


def report_at_exit(waited_s: Optional[float] = None) -> Optional[str]:
    line = summary(waited_s)
    if line:
        logger.warning("%s", line)
    return line
