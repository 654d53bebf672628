"""OTLP/JSON ``AnyValue`` and ``KeyValue`` lists as plain Python values.

Usage::

    any_value({"intValue": "3"})                                   # 3
    attributes_dict([{"key": "a", "value": {"stringValue": "x"}}])  # {"a": "x"}
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional


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


def pair_value(pair: Dict[str, Any]) -> Any:
    """The decoded value of one ``KeyValue`` (fast path for the common scalar kinds)."""
    value = pair.get("value")
    if isinstance(value, dict) and len(value) == 1:
        ((kind, item),) = value.items()
        if kind == "stringValue" or kind == "boolValue":
            return item
        if kind == "intValue":
            return int(item)
    return any_value(value)


def attributes_dict(attributes: Optional[List[Dict[str, Any]]]) -> Dict[str, Any]:
    result: Dict[str, Any] = {}
    for pair in attributes or ():
        result[pair["key"]] = pair_value(pair)
    return result
