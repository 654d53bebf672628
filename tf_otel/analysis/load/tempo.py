"""Grafana Tempo: TraceQL search (``/api/search``) then ``/api/traces/<id>`` (OTLP JSON).

Usage::

    for spans in tempo_batches("http://localhost:3200", job_id="42"):  # a trace at a time
        ...                                  # (load.spill.spill_batches keeps them on disk)

The job id is a resource attribute, so the query uses the unscoped ``.tf_otel.job.id`` (span
or resource); without a job id it searches the step roots.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, List, Optional

from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.load.http import build_url, get_json, url_part
from tf_otel.analysis.load.otlp import decode_traces_data, is_traces_data
from tf_otel.analysis.load.progress import Progress
from tf_otel.analysis.model import Span
from tf_otel.record import ATTR_CATEGORY, ATTR_JOB_ID, STEP_ROOT

DEFAULT_LOOKBACK_S = 7 * 24 * 3600


def traceql_query(job_id: Optional[str]) -> str:
    if job_id:
        escaped = job_id.replace("\\", "\\\\").replace('"', '\\"')
        return f'{{ .{ATTR_JOB_ID} = "{escaped}" }}'
    return f'{{ span.{ATTR_CATEGORY} = "{STEP_ROOT}" }}'


def _trace_document(document: Any) -> Any:
    """``/api/traces`` gives TracesData; ``/api/v2/traces`` wraps it in ``{"trace": ...}``."""
    if isinstance(document, dict) and "trace" in document and not is_traces_data(document):
        return document["trace"]
    return document


def search_trace_ids(
    base_url: str,
    job_id: Optional[str],
    start_ns: Optional[int],
    end_ns: Optional[int],
    limit: int,
) -> List[str]:
    end_s = (end_ns // 10**9 + 1) if end_ns is not None else int(time.time()) + 1
    start_s = start_ns // 10**9 if start_ns is not None else end_s - DEFAULT_LOOKBACK_S
    query = {"q": traceql_query(job_id), "start": start_s, "end": end_s, "limit": limit}
    url = build_url(base_url, "/api/search", query)
    document = get_json(url)
    traces = document.get("traces") if isinstance(document, dict) else None
    if not isinstance(traces, list) or not all(isinstance(t, dict) for t in traces):
        raise AnalysisError(f"{url}: not a Tempo search response")
    return [str(trace["traceID"]) for trace in traces if trace.get("traceID")]


def tempo_batches(
    base_url: str,
    job_id: Optional[str] = None,
    start_ns: Optional[int] = None,
    end_ns: Optional[int] = None,
    limit: int = 10000,
    trace_ids: Optional[List[str]] = None,
    progress: Optional[bool] = None,
) -> Iterator[List[Span]]:
    """The search's (or the given) traces' spans, one trace at a time as fetched."""
    ids = trace_ids or search_trace_ids(base_url, job_id, start_ns, end_ns, limit)
    with Progress("tempo: fetching traces", len(ids), progress) as bar:
        for trace_id in ids:
            url = build_url(base_url, f"/api/traces/{url_part(trace_id)}")
            yield decode_traces_data(_trace_document(get_json(url)), url)
            bar.advance()
