"""Run the analysis (``tf-otel analyze``'s ``analyze_spans``) on spans a test's receiver got.

Usage::

    result = analyze_received(receiver.spans())
    findings = {f.rule: f for f in result.findings}
"""

from __future__ import annotations

from typing import Any, Iterable

from tf_otel.analysis.analyze import analyze_spans
from tf_otel.analysis.model import Span


def analyze_received(received: Iterable[Any]) -> Any:
    """The receiver's spans (``otlp_receiver.ReceivedSpan``) as the analysis' own spans."""
    spans = [
        Span(
            s.trace_id,
            s.span_id,
            s.parent_id,
            s.name,
            s.start_ns,
            s.end_ns,
            dict(s.attributes),
            dict(s.resource),
        )
        for s in received
    ]
    spans.sort(key=lambda span: span.trace_id)  # the loaders hand over runs of one trace
    return analyze_spans(spans, source="receiver")
