"""The one builder the OTLP-JSON decoders make rows with (``decoders`` chooses among them).

A row (``model.Row``, its fields named by ``model.SpanRow``) holds a ``Span``'s fields in slot
order: the loaders' workers send rows and the parent makes ``Span``s of them with
``Span.from_row``. The reference decoder (``otlp.decode_traces_rows``, any JSON parser) and the
msgspec fast path (``otlp_msgspec``) differ only in how they read the bytes: both hand the raw
ids, name, times and the decoded analysis attributes of each span to a ``RowBuilder``, which
normalises the ids, applies the resource's rank and job, splits the slot attributes from the
kept ones and coerces their types; the native decoder asks it once per distinct value.

Usage::

    build = RowBuilder()                      # one per input: caches ids and names
    build.set_resource(attributes_dict(resource_attributes))
    found = FOUND_TEMPLATE.copy()             # then found[key] = value per analysis attribute
    row = build.row(trace_id, span_id, parent_id, name, start_ns, end_ns, found)
    tail = build.tail(found)                  # the row's fields from ``attributes`` on
    SpanRow._make(row).category
"""

from __future__ import annotations

import base64
import binascii
from operator import itemgetter
from typing import Any, Callable, Dict, Optional, Tuple

from tf_otel.analysis.model import ATTR_GPU_UTILIZATION, SLOT_ATTRIBUTES, Row, as_int, job_of
from tf_otel.record import ATTR_CATEGORY, ATTR_JOB_ID, ATTR_RANK, ATTR_STEP

NO_ATTRIBUTES: Dict[str, Any] = {}  # shared by spans with no kept attributes; never mutated
_ZEROS = {16: "0" * 32, 8: "0" * 16}
# A span's analysis attributes start as the slots' defaults: the decoders store what they
# find over them, and the builder reads all five back with one C call.
SLOT_KEYS = (ATTR_CATEGORY, ATTR_RANK, ATTR_STEP, ATTR_JOB_ID, ATTR_GPU_UTILIZATION)
FOUND_TEMPLATE: Dict[str, Any] = dict(zip(SLOT_KEYS, ("", None, None, None, None)))
_slots = itemgetter(*SLOT_KEYS)
_SLOT_COUNT = len(SLOT_KEYS)
# A row's last seven fields (``model.SpanRow`` from ``attributes`` on): what a span's attribute
# list and its resource give; spans with the same ones share it (``otlp_msgspec``).
RowTail = Tuple[
    Dict[str, Any], Dict[str, Any], str, Optional[int], Optional[int], Optional[str], Any
]
assert frozenset(SLOT_KEYS) == SLOT_ATTRIBUTES


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


class RowBuilder:
    """Makes the rows of one input; trace and parent ids and names repeat across its
    spans, so each is normalised once and its string shared.

    ``row`` and ``set_resource`` are closures over the caches: reading free variables is
    cheaper than reading attributes, which counts at 1.6 M spans (bench/bench_analysis.py).
    """

    __slots__ = ("row", "set_resource", "tail")

    def __init__(self) -> None:
        trace_ids: Dict[Any, str] = {}
        parent_ids: Dict[Any, Optional[str]] = {}
        names: Dict[str, str] = {}
        trace_get, parent_get, name_get = trace_ids.get, parent_ids.get, names.setdefault
        resource: Dict[str, Any] = NO_ATTRIBUTES
        resource_rank: Any = None
        has_resource_job = False
        resource_job: Any = None

        def set_resource(attributes: Dict[str, Any]) -> None:
            """The decoded resource attributes of the spans that follow."""
            nonlocal resource, resource_rank, has_resource_job, resource_job
            resource = attributes
            resource_rank = attributes.get(ATTR_RANK)
            has_resource_job = ATTR_JOB_ID in attributes
            # with its attempt where the resource names one (``model.job_of``)
            resource_job = job_of(attributes, attributes.get(ATTR_JOB_ID))

        def tail(found: Dict[str, Any]) -> RowTail:
            """A row's fields from ``attributes`` on (``ROW_TAIL``). ``found``:
            ``FOUND_TEMPLATE.copy()`` with the span's ``model.ANALYSIS_ATTRIBUTES`` stored over
            it, decoded (the last of a repeated key wins); the slots are read from it, the other
            attributes are kept."""
            category, rank, step, job, gpu = _slots(found)
            kept = NO_ATTRIBUTES
            if len(found) > _SLOT_COUNT:  # attributes beyond the slots: kept, in their order
                kept = {k: v for k, v in found.items() if k not in SLOT_ATTRIBUTES}
            if has_resource_job:
                job = resource_job
            if rank is None:
                rank = resource_rank
            return (
                kept,
                resource,
                category if type(category) is str else str(category),
                rank if type(rank) is int else as_int(rank),
                step if type(step) is int or step is None else as_int(step),
                None if job is None else str(job),
                gpu,
            )

        def row(
            trace_id: Any,
            span_id: Any,
            parent_id: Any,
            name: Any,
            start_ns: int,
            end_ns: int,
            found: Dict[str, Any],
        ) -> Row:
            """One span's row; ``found`` as ``tail`` takes it."""
            trace = trace_get(trace_id)
            if trace is None:
                trace = trace_ids[trace_id] = normalise_id(trace_id, 16) or ""
            if not (len(span_id) == 16 and span_id.islower() and span_id.isalnum()):
                span_id = normalise_id(span_id, 8) or ""
            parent = parent_get(parent_id) if parent_id else None
            if parent is None and parent_id:
                parent = parent_ids[parent_id] = normalise_id(parent_id, 8)
            if type(name) is str:  # names repeat every step: share one string
                name = name_get(name, name)
            head = (trace, span_id, parent or None, name, start_ns)
            return head + (end_ns if end_ns >= start_ns else start_ns,) + tail(found)

        self.row: Callable[[Any, Any, Any, Any, int, int, Dict[str, Any]], Row] = row
        self.set_resource: Callable[[Dict[str, Any]], None] = set_resource
        self.tail: Callable[[Dict[str, Any]], RowTail] = tail
