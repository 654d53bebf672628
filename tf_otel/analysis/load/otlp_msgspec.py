"""Fast path for ``TracesData`` lines: ``msgspec`` typed decoding of only the fields read.

``msgspec`` (optional) decodes a line straight into the small ``Struct`` classes below,
skipping every other field in C. A span's attribute list stays raw bytes: the row fields it
gives (``rows.RowTail``) are made once per distinct list and resource, since a step's ops on a
rank repeat them (one list in ten is new on bench/bench_analysis.py's traces). A line outside
this plain layout (other spellings, nulls, non-string ids, values that do not decode, invalid
JSON, ...) gives ``None``: the caller decodes it again on the reference path
(``otlp.decode_traces_rows``), which gives the same rows or names the error. Chosen by
``decoders``.

Usage::

    decoder = MsgspecLineDecoder()           # only when AVAILABLE
    rows = decoder.decode(data, begin, end)  # data[begin:end]: one line; rows or None
"""

from __future__ import annotations

from typing import Annotated, Any, Dict, List, Optional, Tuple, Union

from tf_otel.analysis.load._json import DECODE_ERRORS, loads
from tf_otel.analysis.load.otlp import MALFORMED
from tf_otel.analysis.load.rows import FOUND_TEMPLATE, RowBuilder, RowTail, normalise_id
from tf_otel.analysis.model import ANALYSIS_ATTRIBUTES, Row
from tf_otel.analysis.otlp_values import attributes_dict, pair_value

try:  # optional speed-up, never required
    import msgspec
except ImportError:  # pragma: no cover - depends on the environment
    msgspec = None  # type: ignore[assignment]

AVAILABLE = msgspec is not None


class _Ambiguous(Exception):
    """A line the fast path leaves to the generic path."""


if msgspec is not None:
    _NULL = msgspec.Raw(b"null")

    class _KeyValue(msgspec.Struct, gc=False):  # of a span's attribute list not seen before
        key: str
        value: msgspec.Raw = _NULL  # decoded (and cached) only for the analysis attributes

    # orjson reads integers beyond 64 bits as floats: larger times go to the generic path
    _Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]

    class _Span(msgspec.Struct, gc=False):
        traceId: str
        spanId: str
        startTimeUnixNano: Union[_Int64, str]
        endTimeUnixNano: Union[_Int64, str]
        parentSpanId: Optional[str] = None
        name: Optional[str] = ""
        attributes: msgspec.Raw = _NULL  # decoded once per distinct list (``_tail``)

    class _ScopeSpans(msgspec.Struct, gc=False):
        spans: Optional[List[_Span]] = None

    class _ResourceSpans(msgspec.Struct, gc=False):
        resource: msgspec.Raw = _NULL  # decoded in full (once per line) on the generic path
        scopeSpans: Optional[List[_ScopeSpans]] = None

    class _TracesData(msgspec.Struct, gc=False):
        resourceSpans: Optional[List[_ResourceSpans]] = None

    _DECODE_ERRORS: tuple = (msgspec.DecodeError, msgspec.ValidationError)


_IMMUTABLE = (str, int, float, bool, type(None))
_VALUE_CACHE_MAX = 100_000  # distinct raw values remembered per input


def _value(raw: bytes) -> Any:
    """A raw ``AnyValue`` as the generic path decodes it (``decode_traces_rows``)."""
    value = loads(raw)
    if type(value) is dict and len(value) == 1 and "stringValue" in value:
        return value["stringValue"]
    if type(value) is dict and len(value) == 1 and "intValue" in value:
        return int(value["intValue"])
    return pair_value({"value": value})


# Spans' attribute lists repeat (a step's ops on one rank carry the same category, rank, step):
# the row fields each gives are kept per resource, by the list's bytes, this many at most.
_TAILS_MAX = 4096
_RESOURCES_MAX = 64


class MsgspecLineDecoder:
    """Decodes the lines of one input; caches ids, resources and attribute lists across its
    lines."""

    def __init__(self) -> None:
        self._decoder = msgspec.json.Decoder(_TracesData)
        self._attributes = msgspec.json.Decoder(Optional[List[_KeyValue]])
        self._build = RowBuilder()  # slots and resource applied as the generic path does
        self._values: Dict[bytes, Any] = {}
        # a resource's bytes -> its attributes and the row tails of its attribute lists
        self._resources: Dict[bytes, Tuple[Dict[str, Any], Dict[bytes, RowTail]]] = {}
        self._trace_ids: Dict[str, str] = {}
        self._parent_ids: Dict[str, Optional[str]] = {}
        self._names: Dict[str, str] = {}

    def decode(self, data: bytes, begin: int, end: int) -> Optional[List[Row]]:
        """The rows of the line ``data[begin:end]`` (read in place); None where the generic
        path must decide."""
        try:
            traces = self._decoder.decode(memoryview(data)[begin:end])
        except (*_DECODE_ERRORS, RecursionError):  # msgspec: nesting too deep for it
            return None
        if not traces.resourceSpans:
            return None  # missing, null or empty: "batches" or a non-OTLP document
        try:
            return self._rows(traces)
        except (_Ambiguous, *_DECODE_ERRORS, *MALFORMED, *DECODE_ERRORS):
            return None  # the generic path repeats it and names the error

    def _rows(self, data: Any) -> List[Row]:
        """``RowBuilder.row`` inlined: one call per span was a third of the decoding."""
        rows: List[Row] = []
        append = rows.append
        trace_ids, parent_ids = self._trace_ids, self._parent_ids
        trace_get, parent_get = trace_ids.get, parent_ids.get
        name_get = self._names.setdefault
        for resource_spans in data.resourceSpans:
            tails = self._resource(bytes(resource_spans.resource))
            tails_get = tails.get
            if resource_spans.scopeSpans is None:
                raise _Ambiguous  # maybe the older instrumentationLibrarySpans
            for scope in resource_spans.scopeSpans:
                for raw in scope.spans or ():
                    start_ns = int(raw.startTimeUnixNano)
                    end_ns = int(raw.endTimeUnixNano)
                    attributes = bytes(raw.attributes)
                    tail = tails_get(attributes)
                    if tail is None:
                        tail = self._tail(attributes, tails)
                    if tail[0]:  # kept attributes: each span its own dict
                        tail = (tail[0].copy(), *tail[1:])
                    trace_id = raw.traceId
                    trace = trace_get(trace_id)
                    if trace is None:
                        trace = trace_ids[trace_id] = normalise_id(trace_id, 16) or ""
                    span_id = raw.spanId
                    if not (len(span_id) == 16 and span_id.islower() and span_id.isalnum()):
                        span_id = normalise_id(span_id, 8) or ""
                    parent_id = raw.parentSpanId
                    parent = None
                    if parent_id:
                        parent = parent_get(parent_id)
                        if parent is None:
                            parent = parent_ids[parent_id] = normalise_id(parent_id, 8)
                    name = raw.name
                    if name is not None:  # names repeat every step: share one string
                        name = name_get(name, name)
                    if end_ns < start_ns:
                        end_ns = start_ns
                    append((trace, span_id, parent, name, start_ns, end_ns, *tail))
        return rows

    def _resource(self, raw: bytes) -> Dict[bytes, RowTail]:
        """Sets the builder's resource; the row tails of its attribute lists."""
        known = self._resources.get(raw)
        if known is None:
            resource = attributes_dict((loads(raw) or {}).get("attributes"))
            known = (resource, {})
            if len(self._resources) < _RESOURCES_MAX:
                self._resources[raw] = known
        self._build.set_resource(known[0])
        return known[1]

    def _tail(self, attributes: bytes, tails: Dict[bytes, RowTail]) -> RowTail:
        """The row tail of an attribute list not seen before (with this resource)."""
        found = FOUND_TEMPLATE.copy()
        shared = True
        values = self._values
        for pair in self._attributes.decode(attributes) or ():
            key = pair.key
            if key not in ANALYSIS_ATTRIBUTES:
                continue  # not read by the analysis: never decoded
            # values repeat (category, rank, step): decode each once
            raw_value = bytes(pair.value)
            value = values.get(raw_value, values)
            if value is values:
                value = _value(raw_value)
                if type(value) in _IMMUTABLE and len(values) < _VALUE_CACHE_MAX:
                    values[raw_value] = value
            shared = shared and type(value) in _IMMUTABLE
            found[key] = value
        tail = self._build.tail(found)
        if shared:  # a list or dict value is each span's own
            if len(tails) >= _TAILS_MAX:
                tails.clear()  # the older steps' lists: seldom seen again
            tails[attributes] = tail
        return tail
