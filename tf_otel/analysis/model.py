"""The internal span model every loader normalises to.

Usage::

    span = Span("a" * 32, "b" * 16, None, "step", 0, 10, {"tf_otel.category": "step"}, {})
    span.category, span.rank, span.step
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from tf_otel.record import ATTR_CATEGORY, ATTR_JOB_ID, ATTR_RANK, ATTR_STEP


def _as_int(value: Any) -> Optional[int]:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class Span:
    """One span: ids in lowercase hex, times in ns since the Unix epoch (reference clock)."""

    __slots__ = (
        "trace_id",
        "span_id",
        "parent_id",
        "name",
        "start_ns",
        "end_ns",
        "attributes",
        "resource",
        "category",
        "rank",
        "step",
    )

    def __init__(
        self,
        trace_id: str,
        span_id: str,
        parent_id: Optional[str],
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: Dict[str, Any],
        resource: Dict[str, Any],
    ) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id or None
        self.name = name
        self.start_ns = start_ns
        self.end_ns = end_ns if end_ns >= start_ns else start_ns
        self.attributes = attributes
        self.resource = resource
        self.category: str = str(attributes.get(ATTR_CATEGORY, ""))
        rank = attributes.get(ATTR_RANK)
        if rank is None:
            rank = resource.get(ATTR_RANK)
        self.rank: Optional[int] = _as_int(rank)
        self.step: Optional[int] = _as_int(attributes.get(ATTR_STEP))

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def job_id(self) -> Optional[str]:
        job = self.resource.get(ATTR_JOB_ID, self.attributes.get(ATTR_JOB_ID))
        return None if job is None else str(job)

    def __repr__(self) -> str:
        return (
            f"Span({self.name!r}, {self.category}, rank={self.rank}, step={self.step}, "
            f"{self.start_ns}..{self.end_ns})"
        )
