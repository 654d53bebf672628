"""Fast path for ``TracesData`` lines: ``msgspec`` typed decoding of only the fields read.

``msgspec`` (optional) decodes a line straight into the small ``Struct`` classes below,
skipping every other field in C. A line outside this plain layout (other spellings, nulls,
non-string ids, values that do not decode, invalid JSON, ...) gives ``None``: the caller decodes it
again on the generic path (``otlp.decode_traces_rows``), which gives the same rows, or the
same error, as before this fast path existed.

Usage::

    decoder = LineDecoder()        # only when AVAILABLE
    rows = decoder.decode(line)    # a list of ``model.Row``s, or None
"""

from __future__ import annotations

from typing import Annotated, Any, Dict, List, Optional, Union

from tf_otel.analysis.load._json import DECODE_ERRORS, loads
from tf_otel.analysis.load.otlp import MALFORMED
from tf_otel.analysis.load.rows import FOUND_TEMPLATE, RowBuilder
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

    class _KeyValue(msgspec.Struct, gc=False):
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
        attributes: Optional[List[_KeyValue]] = None

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


class LineDecoder:
    """Decodes the lines of one input; caches normalised ids across its lines."""

    def __init__(self) -> None:
        self._decoder = msgspec.json.Decoder(_TracesData)
        self._build = RowBuilder()  # ids and names cached across the input's lines
        self._values: Dict[bytes, Any] = {}

    def decode(self, line: Union[bytes, memoryview]) -> Optional[List[Row]]:
        """The line's spans as rows; None where the generic path must decide."""
        try:
            data = self._decoder.decode(line)
        except (*_DECODE_ERRORS, RecursionError):  # msgspec: nesting too deep for it
            return None
        if not data.resourceSpans:
            return None  # missing, null or empty: "batches" or a non-OTLP document
        try:
            return self._rows(data)
        except (_Ambiguous, *MALFORMED, *DECODE_ERRORS):
            return None  # the generic path repeats it and names the error

    def _rows(self, data: Any) -> List[Row]:
        rows: List[Row] = []
        append = rows.append
        build = self._build
        row = build.row
        template = FOUND_TEMPLATE.copy
        kept_keys = ANALYSIS_ATTRIBUTES
        values = self._values
        for resource_spans in data.resourceSpans:
            resource_obj = loads(bytes(resource_spans.resource)) or {}
            build.set_resource(attributes_dict(resource_obj.get("attributes")))
            if resource_spans.scopeSpans is None:
                raise _Ambiguous  # maybe the older instrumentationLibrarySpans
            for scope in resource_spans.scopeSpans:
                for raw in scope.spans or ():
                    start_ns = int(raw.startTimeUnixNano)
                    end_ns = int(raw.endTimeUnixNano)
                    found = template()
                    for pair in raw.attributes or ():
                        key = pair.key
                        if key not in kept_keys:
                            continue  # not read by the analysis: never decoded
                        # values repeat (category, rank, step): decode each once
                        raw_value = bytes(pair.value)
                        value = values.get(raw_value, values)
                        if value is values:
                            value = _value(raw_value)
                            if type(value) in _IMMUTABLE and len(values) < _VALUE_CACHE_MAX:
                                values[raw_value] = value
                        found[key] = value
                    append(
                        row(
                            raw.traceId,
                            raw.spanId,
                            raw.parentSpanId,
                            raw.name,
                            start_ns,
                            end_ns,
                            found,
                        )
                    )
        return rows
