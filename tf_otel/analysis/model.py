"""The internal span model every loader normalises to.

Usage::

    span = Span("a" * 32, "b" * 16, None, "step", 0, 10, {"tf_otel.category": "step"}, {})
    span.category, span.rank, span.step, span.job_id

The fields the analysis reads on every span (category, rank, step, job id, GPU utilisation) are
decoded up front; the OTLP loader keeps the rest of a span's attributes in their raw OTLP form
and decodes them on first use of ``attributes`` (most spans are never asked).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.otlp_values import attributes_dict
from tf_otel.record import ATTR_CATEGORY, ATTR_JOB_ID, ATTR_RANK, ATTR_STEP

ATTR_GPU_UTILIZATION = "gpu.utilization"


def as_int(value: Any) -> Optional[int]:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


_as_int = as_int  # the old private name


class Span:
    """One span: ids in lowercase hex, times in ns since the Unix epoch (reference clock)."""

    __slots__ = (
        "trace_id",
        "span_id",
        "parent_id",
        "name",
        "start_ns",
        "end_ns",
        "resource",
        "category",
        "rank",
        "step",
        "job_id",
        "gpu_utilization",
        "_attributes",
        "_raw_attributes",
        "_origin",
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
        self._attributes: Optional[Dict[str, Any]] = attributes
        self._raw_attributes: Optional[List[Any]] = None
        self._origin = ""
        self.resource = resource
        self.category: str = str(attributes.get(ATTR_CATEGORY, ""))
        rank = attributes.get(ATTR_RANK)
        if rank is None:
            rank = resource.get(ATTR_RANK)
        self.rank: Optional[int] = as_int(rank)
        self.step: Optional[int] = as_int(attributes.get(ATTR_STEP))
        job = resource.get(ATTR_JOB_ID, attributes.get(ATTR_JOB_ID))
        self.job_id: Optional[str] = None if job is None else str(job)
        self.gpu_utilization: Any = attributes.get(ATTR_GPU_UTILIZATION)

    @property
    def attributes(self) -> Dict[str, Any]:
        """All span attributes (decoded from the raw OTLP list on first use)."""
        if self._attributes is None:
            try:
                self._attributes = attributes_dict(self._raw_attributes)
            except (KeyError, TypeError, ValueError, AttributeError) as error:
                detail = f"missing field {error}" if isinstance(error, KeyError) else str(error)
                raise AnalysisError(
                    f"{self._origin}: malformed OTLP-JSON span attributes ({detail})"
                ) from None
            self._raw_attributes = None
        return self._attributes

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def __repr__(self) -> str:
        return (
            f"Span({self.name!r}, {self.category}, rank={self.rank}, step={self.step}, "
            f"{self.start_ns}..{self.end_ns})"
        )
