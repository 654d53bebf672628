"""Jaeger and Tempo loaders against local HTTP servers serving the same hand-built steps.

The Jaeger server speaks the query API's JSON model (/api/services, /api/traces search,
/api/traces/<id>); the Tempo server answers TraceQL search with trace ids and /api/traces/<id>
with protobuf-JSON (base64 ids). The analysis of either must equal the one of the OTLP file.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_analysis_cli import analyze, straggler_job


class Backend(BaseHTTPRequestHandler):
    routes: dict = {}
    requests: list = []

    def do_GET(self):  # noqa: N802 (http.server API)
        parsed = urllib.parse.urlparse(self.path)
        self.requests.append((parsed.path, urllib.parse.parse_qs(parsed.query)))
        body = self.routes.get(parsed.path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(body(urllib.parse.parse_qs(parsed.query))).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    Backend.routes, Backend.requests = {}, []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def file_report(tmp_path: Path) -> dict:
    path = tmp_path / "traces.jsonl"
    straggler_job().write_otlp(path)
    done = analyze(str(path), "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def comparable(report: dict) -> dict:
    report = dict(report)
    report.pop("source")
    return report


def test_jaeger_search_matches_the_file_analysis(server: str, tmp_path: Path):
    traces = straggler_job().jaeger_traces()
    Backend.routes["/api/services"] = lambda q: {"data": ["train.py", "jaeger-all-in-one"]}
    Backend.routes["/api/traces"] = lambda q: {"data": traces}
    done = analyze("--jaeger", server, "--job", "job-42", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert comparable(json.loads(done.stdout)) == comparable(file_report(tmp_path))
    searches = [query for path, query in Backend.requests if path == "/api/traces"]
    # this server answers every search with every trace, none in the default window (the last
    # week): it does not search by time, so the whole range is asked for once, as before
    assert [q["service"] for q in searches] == [["train.py"]] * 2  # jaeger's own one skipped
    assert json.loads(searches[0]["tags"][0]) == {"tf_otel.job.id": "job-42"}
    assert int(searches[0]["end"][0]) > int(searches[0]["start"][0])
    assert searches[1]["limit"] == ["10000"] and searches[1]["start"] == searches[0]["start"]


def _window_search(traces: list):
    """A Jaeger search that, as the real one, answers the traces with a span starting in
    [start, end] (µs), at most ``limit``, the latest first."""

    def answer(query: dict) -> dict:
        low, high, most = (int(query[key][0]) for key in ("start", "end", "limit"))
        found = [t for t in traces if any(low <= s["startTime"] <= high for s in t["spans"])]
        found.sort(key=lambda t: -min(s["startTime"] for s in t["spans"]))
        return {"data": found[:most]}

    return answer


def test_a_long_jaeger_search_comes_a_page_at_a_time(server: str, tmp_path: Path, monkeypatch):
    from tf_otel.analysis.analyze import analyze_source
    from tf_otel.analysis.load import jaeger
    from tf_otel.analysis.load.spill import spill_batches
    from tf_otel.analysis.report.json_report import to_json

    traces = straggler_job().jaeger_traces()
    starts = [s["startTime"] for t in traces for s in t["spans"]]
    Backend.routes["/api/traces"] = _window_search(traces)
    monkeypatch.setattr(jaeger, "SEARCH_PAGE", 2)
    window = (min(starts) * 1000, max(starts) * 1000)
    batches = list(jaeger.jaeger_batches(server, "train.py", None, *window, progress=False))
    searches = [query for path, query in Backend.requests if path == "/api/traces"]
    assert len(searches) > 3  # 6 traces, 2 a page: the window was halved
    assert all(len({s.trace_id for s in batch}) <= 2 for batch in batches)
    found = [trace_id for batch in batches for trace_id in {s.trace_id for s in batch}]
    assert sorted(found) == sorted(t["traceID"] for t in traces)  # each trace once
    with spill_batches(iter(batches), server) as source:
        paged = to_json(analyze_source(source, source="x"))
    in_memory = to_json(analyze_source(jaeger.convert_jaeger_traces(traces, server), source="x"))
    assert paged == in_memory


def test_jaeger_trace_ids_fetch_each_trace(server: str, tmp_path: Path):
    traces = straggler_job().jaeger_traces()
    for trace in traces:
        Backend.routes[f"/api/traces/{trace['traceID']}"] = lambda q, trace=trace: {"data": [trace]}
    ids = [arg for trace in traces for arg in ("--trace-id", trace["traceID"])]
    done = analyze("--jaeger", server, *ids, "--format", "json", "--progress")
    assert done.returncode == 0, done.stderr
    assert "jaeger: fetching traces" in done.stderr  # --progress draws on a non-TTY too
    assert comparable(json.loads(done.stdout)) == comparable(file_report(tmp_path))


def _base64_ids(document: dict) -> dict:
    for resource_spans in document["resourceSpans"]:
        for scope in resource_spans["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return {"batches": document["resourceSpans"]}


def test_tempo_search_then_fetch(server: str, tmp_path: Path):
    job = straggler_job()
    by_trace: dict = {}
    for line in job.otlp_lines():
        for resource_spans in line["resourceSpans"]:
            for scope in resource_spans["scopeSpans"]:
                for span in scope["spans"]:
                    entry = by_trace.setdefault(span["traceId"], {})
                    entry.setdefault(id(resource_spans), (resource_spans, []))[1].append(span)
    for trace_id, groups in by_trace.items():
        document = {
            "resourceSpans": [
                {"resource": rs["resource"], "scopeSpans": [{"scope": {}, "spans": spans}]}
                for rs, spans in groups.values()
            ]
        }
        Backend.routes[f"/api/traces/{trace_id}"] = lambda q, d=document: _base64_ids(
            json.loads(json.dumps(d))
        )
    Backend.routes["/api/search"] = lambda q: {
        "traces": [{"traceID": trace_id} for trace_id in sorted(by_trace)]
    }
    done = analyze("--tempo", server, "--job", "job-42", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert comparable(json.loads(done.stdout)) == comparable(file_report(tmp_path))
    search = next(query for path, query in Backend.requests if path == "/api/search")
    assert search["q"] == ['{ .tf_otel.job.id = "job-42" }']


def test_unreachable_and_foreign_backends(server: str):
    Backend.routes["/api/services"] = lambda q: {"something": "else"}
    done = analyze("--jaeger", server)
    assert done.returncode == 2 and "not a Jaeger query API response" in done.stderr
    done = analyze("--tempo", server)
    assert done.returncode == 2 and "HTTP 404" in done.stderr and server in done.stderr
    done = analyze("--jaeger", "http://127.0.0.1:9")
    assert done.returncode == 2 and "cannot connect" in done.stderr
    assert "Traceback" not in done.stderr
