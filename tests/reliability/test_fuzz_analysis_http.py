"""Fuzzed Jaeger and Tempo responses (tf_otel.analysis.load.jaeger / .tempo over .http): a real
HTTP server on loopback answers each request with fuzzed bytes: bad status lines, wrong or
missing lengths, cut bodies, non-JSON, and JSON of the right shape with wrong types. The
contract: spans, or the one ``AnalysisError`` naming the server's URL; never another exception,
in bounded time (the server always answers and closes at once).
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Dict

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reliability.test_fuzz_analysis_files import JAEGER_TRACE, TRACES_DATA, _json, _strings
from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.load.jaeger import jaeger_batches
from tf_otel.analysis.load.tempo import tempo_batches

FUZZ = settings(
    max_examples=150,
    deadline=5000,  # ms per example: a few loopback requests on a loaded 2-core machine
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


class FuzzServer:
    """Loopback TCP server: answers a request for a path starting with one of ``responses``'
    keys with those raw bytes (else 404), then closes the connection."""

    def __init__(self) -> None:
        self.responses: Dict[str, bytes] = {}
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                request = b""
                try:
                    while b"\r\n\r\n" not in request and len(request) < 1 << 16:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        request += chunk
                    path = request.split(b" ", 2)[1].decode("latin-1") if b" " in request else ""
                    answer = next(
                        (raw for prefix, raw in self.responses.items() if path.startswith(prefix)),
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
                    )
                    conn.sendall(answer)
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture(scope="module")
def server():
    s = FuzzServer()
    yield s
    s.sock.close()


def _body(document) -> bytes:
    return document if isinstance(document, bytes) else json.dumps(document).encode()


@st.composite
def responses(draw, documents):
    """Raw HTTP responses: mostly well-framed with a fuzzed JSON body, sometimes broken."""
    body = _body(draw(documents | st.binary(max_size=200)))
    status = draw(st.sampled_from([b"200 OK"] * 6 + [b"404 Not Found", b"500 Oops", b"204 No"]))
    length = draw(st.sampled_from(["right"] * 4 + ["missing", "short", "long", "junk"]))
    headers = b"Content-Type: application/json\r\nConnection: close\r\n"
    if length == "right":
        headers += b"Content-Length: %d\r\n" % len(body)
    elif length == "short":
        headers += b"Content-Length: %d\r\n" % max(0, len(body) // 2)
    elif length == "long":
        headers += b"Content-Length: %d\r\n" % (len(body) + 100)  # body cut: IncompleteRead
    elif length == "junk":
        headers += b"Content-Length: x\r\n"
    raw = b"HTTP/1.1 " + status + b"\r\n" + headers + b"\r\n" + body
    return draw(
        st.just(raw)
        | st.just(raw)
        | st.binary(max_size=100)  # not HTTP at all
        | st.integers(0, len(raw)).map(lambda n: raw[:n])  # connection cut anywhere
        | st.sampled_from([b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", b"HTTP/9 x\r\n\r\n"])
    )


def fetched(call, base: str):
    try:
        return call()
    except AnalysisError as error:
        assert str(error).startswith(base), error
        return None


_jaeger_search = st.fixed_dictionaries({"data": st.lists(JAEGER_TRACE, max_size=3) | _json}) | _json
_services = st.fixed_dictionaries(
    {"data": st.lists(st.sampled_from(["train.py", "jaeger-all-in-one"]) | _strings, max_size=3)}
) | _json  # fmt: skip


@FUZZ
@given(responses(_services), responses(_jaeger_search), st.sampled_from(["svc", None]))
@example(
    b"", b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{}", "svc"
)  # body cut short: was http.client.IncompleteRead
@example(b"", b"garbage\r\n\r\n", "svc")  # not HTTP: was http.client.BadStatusLine
def test_jaeger_search(server, services, traces, service):
    server.responses = {"/api/services": services, "/api/traces": traces}
    fetched(lambda: list(jaeger_batches(server.url, service=service, progress=False)), server.url)


@FUZZ
@given(st.lists(_strings, min_size=1, max_size=2), responses(_jaeger_search))
@example(["a b\r\n"], b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")  # was InvalidURL
def test_jaeger_trace_ids(server, trace_ids, traces):
    server.responses = {"/api/traces/": traces}
    fetched(
        lambda: list(jaeger_batches(server.url, trace_ids=trace_ids, progress=False)), server.url
    )


_tempo_search = st.fixed_dictionaries(
    {"traces": st.lists(
        st.fixed_dictionaries({}, optional={"traceID": st.sampled_from(["ab" * 16]) | _strings})
        | _json, max_size=3)}
) | _json  # fmt: skip
_tempo_trace = TRACES_DATA | st.fixed_dictionaries({"trace": TRACES_DATA})


@FUZZ
@given(responses(_tempo_search), responses(_tempo_trace))
@example(
    b'HTTP/1.1 200 OK\r\nContent-Length: 22\r\n\r\n{"traces":[{"traceID":"a b\\r\\n"}]}',
    b"",
)  # a trace id with spaces or newlines: was InvalidURL
@example(b'HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{"traces":[1]}', b"")  # AttributeError
def test_tempo(server, search, trace):
    server.responses = {"/api/search": search, "/api/traces/": trace}
    fetched(lambda: list(tempo_batches(server.url, job_id="j", progress=False)), server.url)


@pytest.mark.parametrize("base", ["localhost:16686", "http://127.0.0.1:1 2", "ftp//x"])
def test_an_unusable_url_is_one_clear_error(base):
    with pytest.raises(AnalysisError, match="not a usable URL|cannot connect"):
        list(jaeger_batches(base, service="svc", progress=False))  # was ValueError / InvalidURL
