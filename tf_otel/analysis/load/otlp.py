"""Decode the OTLP/JSON encoding (``TracesData``) into ``Span``s.

Accepts the spec's hex ids and the base64 ids of protobuf-JSON (Tempo), ``resourceSpans`` and
the older ``batches`` / ``instrumentationLibrarySpans`` spellings.

Usage::

    spans = decode_traces_data({"resourceSpans": [...]}, origin="traces.jsonl line 3")
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, List, Optional

from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.model import ATTR_GPU_UTILIZATION, Span, as_int
from tf_otel.analysis.otlp_values import any_value, attributes_dict, pair_value
from tf_otel.record import ATTR_CATEGORY, ATTR_JOB_ID, ATTR_RANK, ATTR_STEP

__all__ = ["any_value", "attributes_dict", "decode_traces_data", "is_traces_data", "normalise_id"]

# attributes decoded for every span; the rest stay raw until ``Span.attributes`` is read
_HOT_KEYS = frozenset((ATTR_CATEGORY, ATTR_RANK, ATTR_STEP, ATTR_JOB_ID, ATTR_GPU_UTILIZATION))


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
    append = spans.append
    new = Span.__new__
    hot_keys = _HOT_KEYS
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
                    trace_id, span_id = raw["traceId"], raw["spanId"]
                    parent_id = raw.get("parentSpanId")
                    if not (len(trace_id) == 32 and trace_id.islower() and trace_id.isalnum()):
                        trace_id = normalise_id(trace_id, 16) or ""
                    if not (len(span_id) == 16 and span_id.islower() and span_id.isalnum()):
                        span_id = normalise_id(span_id, 8) or ""
                    if parent_id:
                        parent_id = normalise_id(parent_id, 8)
                    name = raw.get("name", "")
                    start_ns = int(raw["startTimeUnixNano"])
                    end_ns = int(raw["endTimeUnixNano"])
                    # one pass over the raw attributes for the keys every span needs
                    category: Any = ""
                    rank = step = job = gpu = None
                    raw_attributes = raw.get("attributes") or ()
                    for pair in raw_attributes:
                        key = pair["key"]
                        if key in hot_keys:
                            value = pair_value(pair)
                            if key == ATTR_CATEGORY:
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
                    span = new(Span)
                    span.trace_id = trace_id
                    span.span_id = span_id
                    span.parent_id = parent_id or None
                    span.name = name
                    span.start_ns = start_ns
                    span.end_ns = end_ns if end_ns >= start_ns else start_ns
                    span.resource = resource
                    span.category = category if type(category) is str else str(category)
                    span.rank = as_int(resource_rank if rank is None else rank)
                    span.step = None if step is None else as_int(step)
                    span.job_id = None if job is None else str(job)
                    span.gpu_utilization = gpu
                    span._attributes = None
                    span._raw_attributes = raw_attributes
                    span._origin = origin
                    append(span)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        detail = f"missing field {error}" if isinstance(error, KeyError) else str(error)
        raise AnalysisError(f"{origin}: malformed OTLP-JSON span ({detail})") from None
    return spans
