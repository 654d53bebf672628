"""Decode the OTLP/JSON encoding (``TracesData``) into ``Span``s.

Accepts the spec's hex ids and the base64 ids of protobuf-JSON (Tempo), ``resourceSpans`` and
the older ``batches`` / ``instrumentationLibrarySpans`` spellings.

Usage::

    spans = decode_traces_data({"resourceSpans": [...]}, origin="traces.jsonl line 3")
"""

from __future__ import annotations

from typing import Any, Dict, List

from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.load.rows import FOUND_TEMPLATE, RowBuilder, normalise_id
from tf_otel.analysis.model import ANALYSIS_ATTRIBUTES, Row, Span, add_spans
from tf_otel.analysis.otlp_values import any_value, attributes_dict, pair_value

__all__ = [
    "any_value",
    "attributes_dict",
    "decode_traces_data",
    "decode_traces_rows",
    "is_traces_data",
    "normalise_id",
]

# what a span of the wrong shape raises while decoded (OverflowError: int() of an infinite
# double; RecursionError: AnyValues nested deeper than the stack allows)
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError)


def kept_value(pair: Dict[str, Any]) -> Any:
    """The value of a ``KeyValue`` the analysis reads (``model.ANALYSIS_ATTRIBUTES``)."""
    value = pair.get("value")
    if type(value) is dict and len(value) == 1:
        if "stringValue" in value:
            return value["stringValue"]
        if "intValue" in value:
            return int(value["intValue"])
    return pair_value(pair)


def is_traces_data(obj: Any) -> bool:
    return isinstance(obj, dict) and ("resourceSpans" in obj or "batches" in obj)


def decode_traces_data(obj: Any, origin: str) -> List[Span]:
    """All spans of one ``TracesData`` object; ``origin`` names the input in errors."""
    spans: List[Span] = []
    add_spans(spans, decode_traces_rows(obj, origin))
    return spans


def decode_traces_rows(obj: Any, origin: str) -> List[Row]:
    """Like ``decode_traces_data``, as ``model.Row``s (no ``Span`` objects made)."""
    if not is_traces_data(obj):
        raise AnalysisError(f"{origin}: not OTLP-JSON (no 'resourceSpans')")
    rows: List[Row] = []
    append = rows.append
    kept_keys = ANALYSIS_ATTRIBUTES
    build = RowBuilder()
    row = build.row
    template = FOUND_TEMPLATE.copy
    try:
        for resource_spans in obj.get("resourceSpans") or obj.get("batches") or ():
            build.set_resource(
                attributes_dict((resource_spans.get("resource") or {}).get("attributes"))
            )
            scopes = resource_spans.get("scopeSpans")
            if scopes is None:
                scopes = resource_spans.get("instrumentationLibrarySpans") or ()
            for scope in scopes:
                for raw in scope.get("spans") or ():
                    trace_id = raw["traceId"]
                    span_id = raw["spanId"]
                    parent_id = raw.get("parentSpanId")
                    name = raw.get("name", "")
                    start_ns = int(raw["startTimeUnixNano"])
                    end_ns = int(raw["endTimeUnixNano"])
                    # decode only the attributes the analysis reads
                    found = template()
                    for pair in raw.get("attributes") or ():
                        key = pair["key"]
                        if key in kept_keys:
                            found[key] = kept_value(pair)
                    append(row(trace_id, span_id, parent_id, name, start_ns, end_ns, found))
    except MALFORMED as error:
        detail = f"missing field {error}" if isinstance(error, KeyError) else str(error)
        raise AnalysisError(f"{origin}: malformed OTLP-JSON span ({detail})") from None
    return rows
