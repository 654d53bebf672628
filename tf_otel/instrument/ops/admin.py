"""On-demand op tracing: a token-protected HTTP endpoint on 127.0.0.1 (rank 0) and SIGUSR2.

Usage::

    TF_OTEL_ADMIN_PORT=8790 TF_OTEL_ADMIN_TOKEN=s3cret TF_OTEL_ENABLED=1 horovodrun ... train.py
    curl -X POST -H 'Authorization: Bearer s3cret' 'http://127.0.0.1:8790/ops?steps=5'
    kill -USR2 <pid of any rank>          # the next TF_OTEL_OPS_SIGNAL_STEPS (10) steps

- The endpoint runs on rank 0 only, only when ``TF_OTEL_ADMIN_PORT`` is set (0: any free port,
  logged), from the first training step on (helper processes never bind it). Without
  ``TF_OTEL_ADMIN_TOKEN`` a token is generated and written to a file only the user can read
  (mode 0600; its path is logged, the token never is). Requests
  without the right token (``Authorization: Bearer <token>`` or ``X-TF-OTEL-Token``) get 401.
- ``POST /ops?steps=K`` -> 200 ``{"start": {step key: first traced step}, "steps": K}``: rank 0
  picks the start (its current step + a margin) and broadcasts it, so every rank traces the same
  steps. ``GET /status`` -> the current op-tracing windows.
- SIGUSR2 on any rank asks rank 0 the same (only installed when the program has no handler).

The endpoint knows nothing of op tracing itself: ``ops.hook`` hands it its request
and status functions through :func:`connect` when it registers (so the two never import each other).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import signal
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Optional
from urllib.parse import parse_qs, urlparse

from tf_otel.health import fail_open, log_once, logger

MAX_STEPS = 10_000
_server: Optional[ThreadingHTTPServer] = None
_installed = False
# set by tf_otel.instrument.ops.hook.register(): ask every rank for K traced steps -> starts by key,
# and the current windows for GET /status
_request: Optional[Callable[[int], Dict[str, int]]] = None
_status: Optional[Callable[[], Dict[str, Any]]] = None
_signal_steps = 10  # TF_OTEL_OPS_SIGNAL_STEPS, given to install()


def connect(request: Callable[[int], Dict[str, int]], status: Callable[[], Dict[str, Any]]) -> None:
    """Give the endpoint and the signal handler the op tracer's request and status functions."""
    global _request, _status
    _request, _status = request, status


class _Handler(BaseHTTPRequestHandler):
    token = ""

    def _authorised(self) -> bool:
        given = self.headers.get("X-TF-OTEL-Token", "")
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            given = auth[len("Bearer ") :].strip()
        return bool(given) and hmac.compare_digest(given.encode(), self.token.encode())

    def _reply(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802
        if not self._authorised():
            self._reply(401, {"error": "missing or wrong token"})
            return
        url = urlparse(self.path)
        if url.path != "/ops":
            self._reply(404, {"error": f"no such endpoint {url.path!r}; POST /ops?steps=K"})
            return
        raw = (parse_qs(url.query).get("steps") or ["10"])[0]
        try:
            steps = int(raw)
            if not 0 < steps <= MAX_STEPS:
                raise ValueError
        except ValueError:
            self._reply(400, {"error": f"steps={raw!r}: expected an integer 1-{MAX_STEPS}"})
            return
        if _request is None:
            self._reply(503, {"error": "op tracing is not registered in this process"})
            return
        starts = _request(steps)
        if not starts:
            self._reply(409, {"error": "no training step seen yet; try again once steps run"})
            return
        self._reply(200, {"start": starts, "steps": steps})

    def do_GET(self) -> None:  # noqa: N802
        if not self._authorised():
            self._reply(401, {"error": "missing or wrong token"})
            return
        if urlparse(self.path).path != "/status":
            self._reply(404, {"error": "GET /status or POST /ops?steps=K"})
            return
        if _status is None:
            self._reply(503, {"error": "op tracing is not registered in this process"})
            return
        self._reply(200, _status())

    def log_message(self, *args: Any) -> None:
        pass


def start_endpoint(port: int, token: Optional[str] = None) -> ThreadingHTTPServer:
    """Serve the admin endpoint on 127.0.0.1:port (0: any free port) in a daemon thread."""
    global _server
    if not token:
        token = secrets.token_urlsafe(24)
        _write_token(token)
    handler = type("Handler", (_Handler,), {"token": token})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="tf_otel-admin", daemon=True).start()
    _server = server
    logger.warning(
        "tf_otel: admin endpoint on http://127.0.0.1:%d (POST /ops?steps=K)", server.server_port
    )
    return server


def _write_token(token: str) -> None:
    """Hand a generated token to the user through a 0600 file: logs are shared, files are not."""
    try:
        fd, path = tempfile.mkstemp(prefix="tf_otel-admin-token-", suffix=".txt")  # 0600, O_EXCL
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    except OSError as exc:
        logger.warning(
            "tf_otel: cannot write the generated admin token to a file (%s); the endpoint is "
            "unusable: set TF_OTEL_ADMIN_TOKEN",
            exc,
        )
        return
    logger.warning("tf_otel: admin token (TF_OTEL_ADMIN_TOKEN not set) is in %s (mode 0600)", path)


def _on_signal(signum: int, frame: Any) -> None:
    # a signal handler runs on the main (training) thread: hand the request to a thread
    def ask() -> None:
        with fail_open("admin.signal"):
            if _request is not None:
                _request(_signal_steps or 10)

    threading.Thread(target=ask, name="tf_otel-ops-request", daemon=True).start()


def start_on_rank0(port: int, token: Optional[str]) -> None:
    """Start the endpoint on ``port`` (TF_OTEL_ADMIN_PORT) if this is rank 0 (called by the ops
    hook at the first training step, on a thread: helper processes that run no steps never
    bind)."""
    from tf_otel.job.topology import detect

    if not detect().is_reference:
        return
    try:
        start_endpoint(port, token)
    except OSError as exc:
        log_once(
            "admin_bind",
            "tf_otel: cannot serve the admin endpoint on 127.0.0.1:%d (%s); "
            "set TF_OTEL_ADMIN_PORT to a free port",
            port,
            exc,
        )


def install(signal_steps: int) -> None:
    """Install the SIGUSR2 handler (main thread, no handler of the program's), once; a signal
    asks for ``signal_steps`` traced steps."""
    global _installed, _signal_steps
    _signal_steps = signal_steps
    if _installed:
        return
    _installed = True
    if hasattr(signal, "SIGUSR2") and threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGUSR2, _on_signal)
        else:
            log_once(
                "admin_signal",
                "tf_otel: SIGUSR2 already has a handler; on-demand op tracing by signal is off",
                level=logging.INFO,
            )
