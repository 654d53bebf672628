"""A log record of logger ``tf_otel`` inside a span's trace: OTLP logs carry its trace and span
ids and the given attributes (a log backend can query them); stderr gets the text.

Usage::

    log_in_trace(logging.WARNING, "rank 2 is late since step 30", {"tf_otel.step": 30}, ctx)
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from tf_otel.health import logger


def log_in_trace(
    level: int, summary: str, attributes: Dict[str, Any], span_context: Optional[Any]
) -> None:
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    token = None
    if span_context is not None:
        token = otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(span_context)))
    try:
        logger.log(level, "%s", summary, extra=attributes)
    finally:
        if token is not None:
            otel_context.detach(token)
