"""Decode the OTLP/JSON encoding (``TracesData``) into ``Span``s.

Accepts the spec's hex ids and the base64 ids of protobuf-JSON (Tempo), ``resourceSpans`` and
the older ``batches`` / ``instrumentationLibrarySpans`` spellings.

Usage::

    spans = decode_traces_data({"resourceSpans": [...]}, origin="traces.jsonl line 3")
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Dict, List, Optional

from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.model import Span


def any_value(value: Any) -> Any:
    """An OTLP ``AnyValue`` as a plain Python value."""
    if not isinstance(value, dict):
        return value
    for key, item in value.items():
        if key == "stringValue" or key == "boolValue":
            return item
        if key == "intValue":
            return int(item)
        if key == "doubleValue":
            return float(item)
        if key == "arrayValue":
            return [any_value(v) for v in (item or {}).get("values", [])]
        if key == "kvlistValue":
            return attributes_dict((item or {}).get("values", []))
        if key == "bytesValue":
            return item
    return None


def attributes_dict(attributes: Optional[List[Dict[str, Any]]]) -> Dict[str, Any]:
    result: Dict[str, Any] = {}
    for pair in attributes or ():
        value = pair.get("value")
        if isinstance(value, dict) and len(value) == 1:
            ((kind, item),) = value.items()
            if kind == "stringValue" or kind == "boolValue":
                result[pair["key"]] = item
                continue
            if kind == "intValue":
                result[pair["key"]] = int(item)
                continue
        result[pair["key"]] = any_value(value)
    return result


_ZEROS = {16: "0" * 32, 8: "0" * 16}


def normalise_id(raw: Any, size: int) -> Optional[str]:
    """A trace (16 bytes) or span (8 bytes) id as lowercase hex; '' / zeros -> None."""
    if not raw:
        return None
    text = str(raw)
    if len(text) == 2 * size and text.isalnum():  # hex (not validated further: opaque id)
        text = text.lower()
        return None if text == _ZEROS[size] else text
    try:
        decoded = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        decoded = b""
    if len(decoded) == size:
        text = decoded.hex()
        return None if text.strip("0") == "" else text
    raise ValueError(f"bad {'trace' if size == 16 else 'span'} id {text!r}")


def is_traces_data(obj: Any) -> bool:
    return isinstance(obj, dict) and ("resourceSpans" in obj or "batches" in obj)


def decode_traces_data(obj: Any, origin: str) -> List[Span]:
    """All spans of one ``TracesData`` object; ``origin`` names the input in errors."""
    if not is_traces_data(obj):
        raise AnalysisError(f"{origin}: not OTLP-JSON (no 'resourceSpans')")
    spans: List[Span] = []
    try:
        for resource_spans in obj.get("resourceSpans") or obj.get("batches") or ():
            resource = attributes_dict((resource_spans.get("resource") or {}).get("attributes"))
            scopes = resource_spans.get("scopeSpans")
            if scopes is None:
                scopes = resource_spans.get("instrumentationLibrarySpans") or ()
            for scope in scopes:
                for raw in scope.get("spans") or ():
                    trace_id, span_id = raw["traceId"], raw["spanId"]
                    parent_id = raw.get("parentSpanId")
                    if not (len(trace_id) == 32 and trace_id.islower() and trace_id.isalnum()):
                        trace_id = normalise_id(trace_id, 16) or ""
                    if not (len(span_id) == 16 and span_id.islower() and span_id.isalnum()):
                        span_id = normalise_id(span_id, 8) or ""
                    if parent_id:
                        parent_id = normalise_id(parent_id, 8)
                    spans.append(
                        Span(
                            trace_id,
                            span_id,
                            parent_id,
                            raw.get("name", ""),
                            int(raw["startTimeUnixNano"]),
                            int(raw["endTimeUnixNano"]),
                            attributes_dict(raw.get("attributes")),
                            resource,
                        )
                    )
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        detail = f"missing field {error}" if isinstance(error, KeyError) else str(error)
        raise AnalysisError(f"{origin}: malformed OTLP-JSON span ({detail})") from None
    return spans
