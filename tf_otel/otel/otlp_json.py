"""ReadableSpans -> OTLP/JSON ``TracesData`` directly, without building protobuf messages.

For the OTLP-JSON file exporter (``TF_OTEL_FILE``): the OTLP protobuf encoder, then
``MessageToDict`` and a pass turning base64 ids into hex, cost about 75 % of the CPU a
collective span costs end to end (bench/bench_detail_cpu.py, py-spy). This writes the same dict
(same keys, same order, same value forms: int64 as strings, enums as integers, defaults left
out, hex ids) straight from the spans. Anything it does not expect (a bytes, mapping or None
attribute value, an integer outside int64, a non-finite float) raises ``Unsupported`` and the
caller falls back to the protobuf path, so the output never differs
(tests/test_otlp_json.py compares both on varied spans). The returned dict shares its
attribute entries with earlier calls (a cache): read it, do not change it.

Usage::

    from tf_otel.otel.otlp_json import Unsupported, traces_data

    try:
        data = traces_data(spans)
    except Unsupported:
        data = <the protobuf path>
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_HAS_IS_REMOTE = 0x100  # SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = 0x200  # SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


class Unsupported(Exception):
    """A value this encoder leaves to the protobuf path."""


def _value(value: Any) -> Dict[str, Any]:
    kind = type(value)  # exact types first: most values are plain str / int (~12 a span)
    if kind is str:
        return {"stringValue": value}
    if kind is int and _INT64_MIN <= value <= _INT64_MAX:
        return {"intValue": str(value)}
    # the checks in the order of the OTLP encoder's _encode_value (bool before int)
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise Unsupported("int64 range")
        return {"intValue": str(value)}
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Unsupported("non-finite double")
        return {"doubleValue": value}
    if isinstance(value, (list, tuple)):
        values = [_value(v) for v in value]
        return {"arrayValue": {"values": values} if values else {}}
    raise Unsupported(type(value).__name__)


# encoded key-values by (key, type, value): a detail step repeats most of them (category, rank,
# step, clock, op, dtype...) and every step repeats its tensor names. Floats are left out (0.0
# and -0.0 hash alike but print differently). The dicts are shared between spans and batches:
# the output of ``traces_data`` is read-only.
_KV_CACHE: Dict[Tuple[str, type, Any], Dict[str, Any]] = {}
_KV_CACHE_MAX = 8192
_CACHED = (str, int, bool)


def _attributes(attributes: Any) -> List[Dict[str, Any]]:
    if not attributes:
        return []
    out = []
    cache = _KV_CACHE
    for key, value in attributes.items():
        kind = type(value)
        if kind in _CACHED:
            entry = (key, kind, value)
            kv = cache.get(entry)
            if kv is None:
                kv = {"key": key, "value": _value(value)}
                if len(cache) >= _KV_CACHE_MAX:
                    cache.clear()
                cache[entry] = kv
        else:
            kv = {"key": key, "value": _value(value)}
        out.append(kv)
    return out


def _flags(context: Any) -> int:
    if context is not None and context.is_remote:
        return _HAS_IS_REMOTE | _IS_REMOTE
    return _HAS_IS_REMOTE


def _trace_state(trace_state: Any) -> Optional[str]:
    if not trace_state:  # None or empty: the protobuf path writes "" and leaves it out too
        return None
    return ",".join(f"{key}={value}" for key, value in trace_state.items())


def _span(span: Any) -> Dict[str, Any]:
    context = span.get_span_context()
    out: Dict[str, Any] = {
        "traceId": format(context.trace_id, "032x"),
        "spanId": format(context.span_id, "016x"),
    }
    state = _trace_state(context.trace_state)
    if state:
        out["traceState"] = state
    parent = span.parent
    if parent:
        out["parentSpanId"] = format(parent.span_id, "016x")
    if span.name:
        out["name"] = span.name
    kind = span.kind.value + 1  # SpanKind.INTERNAL (0) is SPAN_KIND_INTERNAL (1) ...
    out["kind"] = kind
    if span.start_time:
        out["startTimeUnixNano"] = str(span.start_time)
    if span.end_time:
        out["endTimeUnixNano"] = str(span.end_time)
    attributes = _attributes(span.attributes)
    if attributes:
        out["attributes"] = attributes
    if span.dropped_attributes:
        out["droppedAttributesCount"] = span.dropped_attributes
    if span.events:
        events = []
        for event in span.events:
            item: Dict[str, Any] = {}
            if event.timestamp:
                item["timeUnixNano"] = str(event.timestamp)
            if event.name:
                item["name"] = event.name
            event_attributes = _attributes(event.attributes)
            if event_attributes:
                item["attributes"] = event_attributes
            if event.dropped_attributes:
                item["droppedAttributesCount"] = event.dropped_attributes
            events.append(item)
        out["events"] = events
    if span.dropped_events:
        out["droppedEventsCount"] = span.dropped_events
    if span.links:
        links = []
        for link in span.links:
            item = {
                "traceId": format(link.context.trace_id, "032x"),
                "spanId": format(link.context.span_id, "016x"),
            }
            link_attributes = _attributes(link.attributes)
            if link_attributes:
                item["attributes"] = link_attributes
            if link.dropped_attributes:
                item["droppedAttributesCount"] = link.dropped_attributes
            item["flags"] = _flags(link.context)
            links.append(item)
        out["links"] = links
    if span.dropped_links:
        out["droppedLinksCount"] = span.dropped_links
    status = span.status
    if status is not None:
        encoded: Dict[str, Any] = {}
        if status.description:
            encoded["message"] = status.description
        if status.status_code.value:
            encoded["code"] = status.status_code.value
        out["status"] = encoded
    out["flags"] = _flags(parent)
    return out


def _scope(scope: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    if scope is None:
        return out
    if scope.name:
        out["name"] = scope.name
    if scope.version:
        out["version"] = scope.version
    attributes = _attributes(scope.attributes)
    if attributes:
        out["attributes"] = attributes
    return out


def traces_data(spans: Sequence[Any]) -> Dict[str, Any]:
    """One OTLP/JSON ``TracesData`` object for the spans, grouped by resource and scope in the
    order first seen (as the OTLP encoder does)."""
    grouped: Dict[Any, Dict[Any, List[Dict[str, Any]]]] = {}
    by_id: Dict[int, Dict[Any, List[Dict[str, Any]]]] = {}  # Resource hashes are slow (json)
    for span in spans:
        resource = span.resource
        scopes = by_id.get(id(resource))
        if scopes is None:
            scopes = by_id[id(resource)] = grouped.setdefault(resource, {})
        scopes.setdefault(span.instrumentation_scope or None, []).append(_span(span))
    resource_spans = []
    for resource, scopes in grouped.items():
        scope_spans = []
        for scope, encoded in scopes.items():
            item: Dict[str, Any] = {"scope": _scope(scope), "spans": encoded}
            if scope is not None and scope.schema_url:
                item["schemaUrl"] = scope.schema_url
            scope_spans.append(item)
        resource_attributes = _attributes(resource.attributes)
        entry: Dict[str, Any] = {
            "resource": {"attributes": resource_attributes} if resource_attributes else {},
            "scopeSpans": scope_spans,
        }
        if resource.schema_url:
            entry["schemaUrl"] = resource.schema_url
        resource_spans.append(entry)
    return {"resourceSpans": resource_spans} if resource_spans else {}
