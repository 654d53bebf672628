"""Fast path for ``TracesData`` lines: ``msgspec`` typed decoding of only the fields read.

``msgspec`` (optional) decodes a line straight into the small ``Struct`` classes below,
skipping every other field in C. A line outside this plain layout (other spellings, nulls,
non-string ids, values that do not decode, invalid JSON, ...) gives ``None``: the caller decodes it
again on the generic path (``otlp.decode_traces_rows``), which gives the same rows, or the
same error, as before this fast path existed.

Usage::

    decoder = LineDecoder()        # only when AVAILABLE
    rows = decoder.decode(line)    # a list of ``Span.to_row`` tuples, or None
"""

from __future__ import annotations

from typing import Annotated, Any, Dict, List, Optional, Tuple, Union

from tf_otel.analysis.load._json import DECODE_ERRORS, loads
from tf_otel.analysis.load.otlp import MALFORMED, normalise_id
from tf_otel.analysis.model import (
    ANALYSIS_ATTRIBUTES,
    ATTR_GPU_UTILIZATION,
    SLOT_ATTRIBUTES,
    as_int,
)
from tf_otel.analysis.otlp_values import attributes_dict, pair_value
from tf_otel.pipeline.record import ATTR_CATEGORY, ATTR_JOB_ID, ATTR_RANK, ATTR_STEP

try:  # optional speed-up, never required
    import msgspec
except ImportError:  # pragma: no cover - depends on the environment
    msgspec = None  # type: ignore[assignment]

AVAILABLE = msgspec is not None
Row = Tuple[Any, ...]  # ``Span.to_row``
_NO_ATTRIBUTES: Dict[str, Any] = {}  # shared by spans with no kept attributes; never mutated


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


# what each analysis attribute fills: a ``Span`` slot, or (_OTHER) the kept attributes dict
_CATEGORY, _RANK, _STEP, _JOB, _GPU, _OTHER = range(6)
_SLOTS = dict.fromkeys(ANALYSIS_ATTRIBUTES, _OTHER)
_SLOTS.update({ATTR_CATEGORY: _CATEGORY, ATTR_RANK: _RANK, ATTR_STEP: _STEP, ATTR_JOB_ID: _JOB})
_SLOTS[ATTR_GPU_UTILIZATION] = _GPU
assert set(_SLOTS) == ANALYSIS_ATTRIBUTES and len(SLOT_ATTRIBUTES) == _OTHER
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
        self._trace_ids: Dict[str, str] = {}
        self._parent_ids: Dict[str, Optional[str]] = {}
        self._values: Dict[bytes, Any] = {}
        self._names: Dict[Optional[str], Optional[str]] = {}

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
        dispatch = _SLOTS
        trace_ids = self._trace_ids
        parent_ids = self._parent_ids
        values = self._values
        names = self._names
        for resource_spans in data.resourceSpans:
            resource_obj = loads(bytes(resource_spans.resource)) or {}
            resource = attributes_dict(resource_obj.get("attributes"))
            resource_rank = resource.get(ATTR_RANK)
            has_resource_job = ATTR_JOB_ID in resource
            resource_job = resource.get(ATTR_JOB_ID)
            if resource_spans.scopeSpans is None:
                raise _Ambiguous  # maybe the older instrumentationLibrarySpans
            for scope in resource_spans.scopeSpans:
                for raw in scope.spans or ():
                    # trace and parent ids repeat: normalise each once (and share the string)
                    raw_id = raw.traceId
                    trace_id = trace_ids.get(raw_id)
                    if trace_id is None:
                        trace_id = trace_ids[raw_id] = normalise_id(raw_id, 16) or ""
                    span_id = raw.spanId
                    if not (len(span_id) == 16 and span_id.islower() and span_id.isalnum()):
                        span_id = normalise_id(span_id, 8) or ""
                    raw_id = raw.parentSpanId
                    parent_id = parent_ids.get(raw_id) if raw_id else None
                    if parent_id is None and raw_id:
                        parent_id = parent_ids[raw_id] = normalise_id(raw_id, 8)
                    name = raw.name  # names repeat every step: share one string
                    name = names.setdefault(name, name)
                    start_ns = int(raw.startTimeUnixNano)
                    end_ns = int(raw.endTimeUnixNano)
                    # decode only what the analysis reads
                    category: Any = ""
                    rank = step = job = gpu = None
                    kept = _NO_ATTRIBUTES
                    for pair in raw.attributes or ():
                        slot = dispatch.get(pair.key)
                        if slot is None:
                            continue  # not read by the analysis: never decoded
                        # values repeat (category, rank, step): decode each once
                        raw_value = bytes(pair.value)
                        value = values.get(raw_value, values)
                        if value is values:
                            value = _value(raw_value)
                            if type(value) in _IMMUTABLE and len(values) < _VALUE_CACHE_MAX:
                                values[raw_value] = value
                        if slot == _CATEGORY:
                            category = value
                        elif slot == _RANK:
                            rank = value
                        elif slot == _STEP:
                            step = value
                        elif slot == _OTHER:
                            if kept is _NO_ATTRIBUTES:
                                kept = {}
                            kept[pair.key] = value
                        elif slot == _JOB:
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
        return rows
