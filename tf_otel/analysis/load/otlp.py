"""Decode the OTLP/JSON encoding (``TracesData``) into ``Span``s.

Accepts the spec's hex ids and the base64 ids of protobuf-JSON (Tempo), ``resourceSpans`` and
the older ``batches`` / ``instrumentationLibrarySpans`` spellings.

Usage::

    spans = decode_traces_data({"resourceSpans": [...]}, origin="traces.jsonl line 3")
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Dict, List, Optional, Tuple

from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.model import ANALYSIS_ATTRIBUTES, SLOT_ATTRIBUTES, Span, as_int
from tf_otel.analysis.otlp_values import any_value, attributes_dict, pair_value
from tf_otel.pipeline.record import ATTR_CATEGORY, ATTR_JOB_ID, ATTR_RANK, ATTR_STEP

__all__ = [
    "any_value",
    "attributes_dict",
    "decode_traces_data",
    "decode_traces_rows",
    "is_traces_data",
    "normalise_id",
]

_NO_ATTRIBUTES: Dict[str, Any] = {}  # shared by spans with no kept attributes; never mutated


_ZEROS = {16: "0" * 32, 8: "0" * 16}
# what a span of the wrong shape raises while decoded (OverflowError: int() of an infinite
# double; RecursionError: AnyValues nested deeper than the stack allows)
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError)


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
    from_row = Span.from_row
    return [from_row(row) for row in decode_traces_rows(obj, origin)]


def decode_traces_rows(obj: Any, origin: str) -> List[Tuple[Any, ...]]:
    """Like ``decode_traces_data``, as ``Span.to_row`` tuples (no ``Span`` objects made)."""
    if not is_traces_data(obj):
        raise AnalysisError(f"{origin}: not OTLP-JSON (no 'resourceSpans')")
    rows: List[Tuple[Any, ...]] = []
    append = rows.append
    kept_keys = ANALYSIS_ATTRIBUTES
    trace_ids: Dict[str, str] = {}
    parent_ids: Dict[str, Optional[str]] = {}
    slot_keys = SLOT_ATTRIBUTES
    try:
        for resource_spans in obj.get("resourceSpans") or obj.get("batches") or ():
            resource = attributes_dict((resource_spans.get("resource") or {}).get("attributes"))
            resource_rank = resource.get(ATTR_RANK)
            has_resource_job = ATTR_JOB_ID in resource
            resource_job = resource.get(ATTR_JOB_ID)
            scopes = resource_spans.get("scopeSpans")
            if scopes is None:
                scopes = resource_spans.get("instrumentationLibrarySpans") or ()
            for scope in scopes:
                for raw in scope.get("spans") or ():
                    # trace and parent ids repeat: normalise each once (and share the string)
                    raw_id = raw["traceId"]
                    trace_id = trace_ids.get(raw_id)
                    if trace_id is None:
                        trace_id = trace_ids[raw_id] = normalise_id(raw_id, 16) or ""
                    span_id = raw["spanId"]
                    if not (len(span_id) == 16 and span_id.islower() and span_id.isalnum()):
                        span_id = normalise_id(span_id, 8) or ""
                    raw_id = raw.get("parentSpanId")
                    parent_id = parent_ids.get(raw_id) if raw_id else None
                    if parent_id is None and raw_id:
                        parent_id = parent_ids[raw_id] = normalise_id(raw_id, 8)
                    name = raw.get("name", "")
                    start_ns = int(raw["startTimeUnixNano"])
                    end_ns = int(raw["endTimeUnixNano"])
                    # one pass over the raw attributes, decoding only what the analysis reads
                    category: Any = ""
                    rank = step = job = gpu = None
                    kept = _NO_ATTRIBUTES
                    for pair in raw.get("attributes") or ():
                        key = pair["key"]
                        if key not in kept_keys:
                            continue
                        value = pair.get("value")
                        if type(value) is dict and len(value) == 1 and "stringValue" in value:
                            value = value["stringValue"]
                        elif type(value) is dict and len(value) == 1 and "intValue" in value:
                            value = int(value["intValue"])
                        else:
                            value = pair_value(pair)
                        if key not in slot_keys:
                            if kept is _NO_ATTRIBUTES:
                                kept = {}
                            kept[key] = value
                        elif key == ATTR_CATEGORY:
                            category = value
                        elif key == ATTR_RANK:
                            rank = value
                        elif key == ATTR_STEP:
                            step = value
                        elif key == ATTR_JOB_ID:
                            job = value
                        else:
                            gpu = value
                    if has_resource_job:
                        job = resource_job
                    if rank is None:
                        rank = resource_rank
                    append(
                        (
                            trace_id,
                            span_id,
                            parent_id or None,
                            name,
                            start_ns,
                            end_ns if end_ns >= start_ns else start_ns,
                            kept,
                            resource,
                            category if type(category) is str else str(category),
                            rank if type(rank) is int else as_int(rank),
                            step if type(step) is int or step is None else as_int(step),
                            None if job is None else str(job),
                            gpu,
                        )
                    )
    except MALFORMED as error:
        detail = f"missing field {error}" if isinstance(error, KeyError) else str(error)
        raise AnalysisError(f"{origin}: malformed OTLP-JSON span ({detail})") from None
    return rows
