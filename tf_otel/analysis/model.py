"""The internal span model every loader normalises to.

Usage::

    span = Span("a" * 32, "b" * 16, None, "step", 0, 10, {"tf_otel.category": "step"}, {})
    span.category, span.rank, span.step, span.job_id

The fields the analysis reads on every span (category, rank, step, job id, GPU utilisation) are
slots, decoded once. The OTLP-JSON loader (the big inputs) keeps in ``attributes`` only the
``ANALYSIS_ATTRIBUTES`` present on the span and drops the rest undecoded: a span's other
attributes are never read, and decoding 1.6 M attribute lists was a third of the load time.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple, TypeVar

from tf_otel.analysis.step_attributes import WHOLE_STEP_ATTRIBUTES
from tf_otel.record import (
    ATTR_ARRIVAL,
    ATTR_CATEGORY,
    ATTR_COLLECTIVE_KEY,
    ATTR_GPU_UTILIZATION,
    ATTR_JOB_ATTEMPT,
    ATTR_JOB_ID,
    ATTR_LAST_ARRIVAL,
    ATTR_RANK,
    ATTR_REPLICA_LAST,
    ATTR_REPLICA_SPREAD_NS,
    ATTR_REPLICAS,
    ATTR_STEP,
    ATTR_STEP_WORLD_RANKS,
    ATTR_STEP_WORLD_SIZE,
    ATTR_TRANSFER_EDGE,
    ATTR_WAIT_NS,
    ATTR_WORLD_SIZE,
)

# Every attribute the analysis reads; the first five are also (or only) slots of ``Span``.
SLOT_ATTRIBUTES = frozenset(
    (ATTR_CATEGORY, ATTR_RANK, ATTR_STEP, ATTR_JOB_ID, ATTR_GPU_UTILIZATION)
)
ANALYSIS_ATTRIBUTES = (
    SLOT_ATTRIBUTES
    | {
        ATTR_COLLECTIVE_KEY,
        ATTR_LAST_ARRIVAL,
        ATTR_ARRIVAL,
        ATTR_WAIT_NS,
        ATTR_TRANSFER_EDGE,
        ATTR_WORLD_SIZE,
        ATTR_STEP_WORLD_SIZE,  # a root's: the world that ran the step (Horovod Elastic)
        ATTR_STEP_WORLD_RANKS,
        ATTR_REPLICAS,
        ATTR_REPLICA_LAST,
        ATTR_REPLICA_SPREAD_NS,
    }
    | WHOLE_STEP_ATTRIBUTES
)


ATTEMPT_MARK = "@"  # a job's attempt in the analysis' job id: "<job id>@<attempt>"


def job_of(resource: Dict[str, Any], job: Any) -> Optional[str]:
    """The job id the analysis keeps spans apart by: the job's, with its attempt where the
    resource names one (``tf_otel.job.attempt``: a rerun or restart under the same launcher
    identity is a job of its own to the analysis)."""
    if job is None:
        return None
    attempt = resource.get(ATTR_JOB_ATTEMPT)
    return f"{job}{ATTEMPT_MARK}{attempt}" if attempt not in (None, "") else str(job)


def base_job(job: str) -> str:
    """The job id without its attempt (``job_of``)."""
    return job.rpartition(ATTEMPT_MARK)[0] or job


def as_int(value: Any) -> Optional[int]:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class SpanRow(NamedTuple):
    """The names of a ``Row``'s fields: a ``Span``'s slots, in order (``SpanRow._make(row)``
    reads a row by name). Rows themselves are plain tuples: a NamedTuple instance cost 13 % of
    the OTLP decoding per span (bench/bench_analysis.py files) and ``marshal``, which sends rows
    between processes, takes plain tuples only."""

    trace_id: str
    span_id: str
    parent_id: Optional[str]
    name: str
    start_ns: int
    end_ns: int  # never before start_ns
    attributes: Dict[str, Any]  # kept analysis attributes (the OTLP loaders: without slots)
    resource: Dict[str, Any]
    category: str
    rank: Optional[int]
    step: Optional[int]
    job_id: Optional[str]
    gpu_utilization: Any


# A span as the loaders build and send it, in ``SpanRow``'s order (``Span.to_row``/``from_row``).
Row = Tuple[
    str,
    str,
    Optional[str],
    str,
    int,
    int,
    Dict[str, Any],
    Dict[str, Any],
    str,
    Optional[int],
    Optional[int],
    Optional[str],
    Any,
]


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
        "job_id",
        "gpu_utilization",
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
        self.rank: Optional[int] = as_int(rank)
        self.step: Optional[int] = as_int(attributes.get(ATTR_STEP))
        if ATTR_JOB_ID in resource:
            self.job_id: Optional[str] = job_of(resource, resource[ATTR_JOB_ID])
        else:
            job = attributes.get(ATTR_JOB_ID)
            self.job_id = None if job is None else str(job)
        self.gpu_utilization: Any = attributes.get(ATTR_GPU_UTILIZATION)

    def to_row(self) -> Row:
        """The span as a ``Row`` (a plain tuple: cheap to send between processes)."""
        return (
            self.trace_id,
            self.span_id,
            self.parent_id,
            self.name,
            self.start_ns,
            self.end_ns,
            self.attributes,
            self.resource,
            self.category,
            self.rank,
            self.step,
            self.job_id,
            self.gpu_utilization,
        )

    def __reduce__(self) -> Tuple[Any, ...]:
        # its fields and one call back: a slotted object's own pickling writes a dict of its
        # slots and sets them one by one on load (a step kept on disk read back 25 % slower)
        return (_span_of, self.to_row())

    @classmethod
    def from_row(cls, row: Row) -> Span:
        """The span of a ``Row`` (``to_row``, ``load.rows.RowBuilder``); many rows:
        ``add_spans``."""
        made: List[Span] = []
        add_spans(made, (row,))
        return made[0]

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def __repr__(self) -> str:
        return (
            f"Span({self.name!r}, {self.category}, rank={self.rank}, step={self.step}, "
            f"{self.start_ns}..{self.end_ns})"
        )


def _span_of(*row: Any) -> Span:
    """A span unpickled (``Span.__reduce__``): ``add_spans``' unpacking for one span, written
    out again rather than calling ``Span.from_row``, whose extra call costs ~1 % of the analysis
    bench (~160 instructions a span at 64 ranks; ~11 us on a step's load)."""
    span: Span = object.__new__(Span)
    (
        span.trace_id,
        span.span_id,
        span.parent_id,
        span.name,
        span.start_ns,
        span.end_ns,
        span.attributes,
        span.resource,
        span.category,
        span.rank,
        span.step,
        span.job_id,
        span.gpu_utilization,
    ) = row
    return span


def add_spans(spans: List[Span], rows: Iterable[Row]) -> None:
    """Append the span of each row (``Span.from_row``) to ``spans``; written out in one loop,
    since a call per span cost 10 % of reading a trace back."""
    new = object.__new__
    append = spans.append
    for row in rows:
        span = new(Span)
        (
            span.trace_id,
            span.span_id,
            span.parent_id,
            span.name,
            span.start_ns,
            span.end_ns,
            span.attributes,
            span.resource,
            span.category,
            span.rank,
            span.step,
            span.job_id,
            span.gpu_utilization,
        ) = row
        append(span)


T = TypeVar("T")


def by_trace(items: Iterable[T], trace_id: Callable[[T], str]) -> Dict[str, List[T]]:
    """Spans or rows by their trace id, each trace's in input order (duplicates kept); a
    trace's come in runs, each taken at C speed."""
    traces: Dict[str, List[T]] = {}
    for trace, run in groupby(items, key=trace_id):
        found = traces.get(trace)
        if found is None:
            traces[trace] = list(run)
        else:
            found.extend(run)
    return traces
