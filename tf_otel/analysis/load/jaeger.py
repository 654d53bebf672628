"""Jaeger: the query service's HTTP API (``/api/traces``) and its JSON trace model.

Usage::

    for spans in jaeger_batches("http://localhost:16686", service="train.py", job_id="42",
                                start_ns=None, end_ns=None, limit=1000):
        ...                                  # a trace (given ids) or a search page at a time
    spans = convert_jaeger_traces(json.load(open("jaeger-ui-download.json"))["data"], "file")

Jaeger keeps microseconds: times come back as multiples of 1,000 ns. Resource attributes are
Jaeger "process" tags; ``service.name`` is the process's ``serviceName``.

A search page at a time (``load.spill.spill_batches`` keeps
them on disk): a search answer holds whole traces (a step of 64 ranks is ~7 MB of JSON), so a
time window whose answer would hold more than ``SEARCH_PAGE`` traces is searched again in
halves, and memory holds one page. A trace found in two windows is taken once.
"""

from __future__ import annotations

import json
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Set, Tuple

from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.load.http import build_url, get_json, url_part
from tf_otel.analysis.load.progress import Progress
from tf_otel.analysis.model import Span
from tf_otel.record import ATTR_JOB_ID

DEFAULT_LOOKBACK_NS = 7 * 24 * 3600 * 10**9
_TAG_TYPES = {"int64": int, "float64": float}


def _tags(tags: Optional[Iterable[Dict[str, Any]]]) -> Dict[str, Any]:
    result: Dict[str, Any] = {}
    for tag in tags or ():
        value = tag.get("value")
        convert = _TAG_TYPES.get(tag.get("type", ""))
        if convert is not None and value is not None:
            value = convert(value)
        result[tag["key"]] = value
    return result


def _hex_id(raw: Any, size: int) -> str:
    text = str(raw or "").lower()
    int(text or "0", 16)  # ValueError on a non-hex id
    return text.rjust(2 * size, "0")


def is_jaeger_document(obj: Any) -> bool:
    data = obj.get("data") if isinstance(obj, dict) else None
    return isinstance(data, list) and all(isinstance(t, dict) and "traceID" in t for t in data)


def convert_jaeger_traces(traces: Iterable[Dict[str, Any]], origin: str) -> List[Span]:
    """Jaeger JSON-model traces (the ``data`` list of the query API) -> ``Span``s."""
    spans: List[Span] = []
    try:
        for trace in traces:
            processes: Dict[str, Dict[str, Any]] = {}
            for process_id, process in (trace.get("processes") or {}).items():
                resource = _tags(process.get("tags"))
                resource.setdefault("service.name", process.get("serviceName"))
                processes[process_id] = resource
            for raw in trace.get("spans") or ():
                parent = None
                for reference in raw.get("references") or ():
                    if reference.get("refType") == "CHILD_OF":
                        parent = _hex_id(reference["spanID"], 8)
                        break
                start_ns = int(raw["startTime"]) * 1000
                spans.append(
                    Span(
                        _hex_id(raw["traceID"], 16),
                        _hex_id(raw["spanID"], 8),
                        parent,
                        raw.get("operationName", ""),
                        start_ns,
                        start_ns + int(raw.get("duration", 0)) * 1000,
                        _tags(raw.get("tags")),
                        processes.get(raw.get("processID", ""), {}),
                    )
                )
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        detail = f"missing field {error}" if isinstance(error, KeyError) else str(error)
        raise AnalysisError(f"{origin}: malformed Jaeger trace ({detail})") from None
    return spans


def _services(base_url: str) -> List[str]:
    document = get_json(build_url(base_url, "/api/services"))
    names = document.get("data") if isinstance(document, dict) else None
    if not isinstance(names, list):
        raise AnalysisError(f"{base_url}/api/services: not a Jaeger query API response")
    return sorted(str(name) for name in names if name and not str(name).startswith("jaeger"))


SEARCH_PAGE = 16  # traces a search answer may hold before its window is searched in halves


def jaeger_batches(
    base_url: str,
    service: Optional[str] = None,
    job_id: Optional[str] = None,
    start_ns: Optional[int] = None,
    end_ns: Optional[int] = None,
    limit: int = 10000,
    trace_ids: Optional[List[str]] = None,
    progress: Optional[bool] = None,
) -> Iterator[List[Span]]:
    """Search (per service, by job id tag and time range) or fetch the given trace ids: their
    spans a trace (given ids) or a search page at a time; at most ``limit`` traces in all."""
    if trace_ids:
        with Progress("jaeger: fetching traces", len(trace_ids), progress) as bar:
            for trace_id in trace_ids:
                document = get_json(build_url(base_url, f"/api/traces/{url_part(trace_id)}"))
                yield convert_jaeger_traces(_traces(document, base_url), base_url)
                bar.advance()
        return
    end_ns = end_ns if end_ns is not None else time.time_ns()
    start_ns = start_ns if start_ns is not None else end_ns - DEFAULT_LOOKBACK_NS
    services = [service] if service else _services(base_url)
    seen: Set[str] = set()
    with Progress("jaeger: searching services", len(services), progress) as bar:
        for name in services:
            pages = _search_pages(base_url, name, job_id, start_ns // 1000, end_ns // 1000, limit)
            for traces in pages:
                new = []
                for trace in traces:
                    trace_id = str(trace.get("traceID"))
                    if trace_id not in seen and len(seen) < limit:
                        seen.add(trace_id)
                        new.append(trace)
                if new:
                    yield convert_jaeger_traces(new, base_url)
            bar.advance()


def _search_pages(
    base_url: str, service: str, job_id: Optional[str], start_us: int, end_us: int, limit: int
) -> Iterator[List[Dict[str, Any]]]:
    """The service's traces in [start_us, end_us], a page of at most SEARCH_PAGE traces at a
    time in time order: a window with more is searched again in halves (a window of one
    microsecond is taken whole, up to ``limit`` traces). A server that answers with traces none
    of whose spans start in the window does not search by time: the whole range is searched
    once, as one answer."""

    def search(low: int, high: int, most: int) -> List[Dict[str, Any]]:
        query = {
            "service": service,
            "start": low,
            "end": high,
            "limit": most,
            "tags": json.dumps({ATTR_JOB_ID: job_id}) if job_id else None,
        }
        return _traces(get_json(build_url(base_url, "/api/traces", query)), base_url)

    windows: List[Tuple[int, int]] = [(start_us, end_us)]
    while windows:
        low, high = windows.pop()
        traces = search(low, high, SEARCH_PAGE + 1)
        if not all(_starts_within(trace, low, high) for trace in traces):
            yield search(start_us, end_us, limit)
            return
        if len(traces) > SEARCH_PAGE:
            if high - low > 1:
                middle = (low + high) // 2
                windows += [(middle, high), (low, middle)]  # the earlier half first; a trace
                # at the edge comes twice and is taken once (jaeger_batches)
                continue
            traces = search(low, high, limit)
        yield traces


def _starts_within(trace: Any, low: int, high: int) -> bool:
    """Whether one of the trace's spans starts in [low, high] (µs), as a search matched it."""
    spans = trace.get("spans") if isinstance(trace, dict) else None
    for span in spans if isinstance(spans, list) else ():
        start = span.get("startTime") if isinstance(span, dict) else None
        if isinstance(start, int) and low <= start <= high:
            return True
    return False


def _traces(document: Any, base_url: str) -> List[Dict[str, Any]]:
    if not is_jaeger_document(document):
        raise AnalysisError(f"{base_url}: not a Jaeger query API response")
    return list(document["data"])
