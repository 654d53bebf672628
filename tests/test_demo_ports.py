"""`make demo` starts Jaeger on ports it found free; another process can take one before Jaeger
binds it. The demo then starts Jaeger again on new ports (a few times), and any other failure
still stops it with Jaeger's log named. Jaeger is stood in for by a small program that says
what Jaeger says when a port is taken, then (or at once) answers on the query port.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Iterator, List

import pytest
from ports import free_ports

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("demo_script", REPO / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "OUT", tmp_path)
    monkeypatch.setattr(module, "PID_FILE", tmp_path / "jaeger.pid")
    monkeypatch.setattr(module, "PORTS", dict(zip(module.PORTS, free_ports(len(module.PORTS)))))
    monkeypatch.setattr(module, "say", lambda text: None)
    yield module
    pid_file = tmp_path / "jaeger.pid"
    if pid_file.exists():  # the stand-in left serving
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pid_file.read_text().strip()), signal.SIGKILL)


def _stand_in(tmp_path: Path, taken_times: int, other_failure: bool = False) -> Path:
    """A 'Jaeger' that fails ``taken_times`` starts as a taken port does, then serves."""
    program = tmp_path / "jaeger"
    program.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(
            f"""
            import http.server, os, sys
            from pathlib import Path
            count = Path({str(tmp_path / "starts")!r})
            starts = int(count.read_text()) + 1 if count.exists() else 1
            count.write_text(str(starts))
            port = int(os.environ["JAEGER_QUERY_HTTP_PORT"])
            if {other_failure!r}:
                print("error: the config file is not valid"); sys.exit(1)
            if starts <= {taken_times}:
                print(f"listen tcp 127.0.0.1:{{port}}: bind: address already in use")
                sys.exit(1)
            class Answer(http.server.BaseHTTPRequestHandler):
                def do_GET(self):
                    self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}")
                def log_message(self, *args):
                    pass
            http.server.HTTPServer(("127.0.0.1", port), Answer).serve_forever()
            """
        )
    )
    program.chmod(0o755)
    return program


def _starts(tmp_path: Path) -> int:
    return int((tmp_path / "starts").read_text())


def test_a_port_taken_before_jaeger_binds_it_means_new_ports(
    demo: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo, "jaeger_binary", lambda: _stand_in(tmp_path, taken_times=2))
    asked: List[int] = []
    free_port = demo.free_port

    def counted() -> int:
        asked.append(1)
        return free_port()

    monkeypatch.setattr(demo, "free_port", counted)
    started = demo.start_jaeger()
    assert _starts(tmp_path) == 3
    assert len(asked) == 2 * len(demo.PORTS)  # every port chosen again, twice
    assert started["query"].startswith("http://127.0.0.1:")


def test_ports_taken_every_time_stop_the_demo(
    demo: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo, "jaeger_binary", lambda: _stand_in(tmp_path, taken_times=9))
    with pytest.raises(SystemExit, match=r"could not bind its ports \(3 tries\).*jaeger.log"):
        demo.start_jaeger()
    assert _starts(tmp_path) == demo.START_TRIES


def test_another_failure_is_not_tried_again(
    demo: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = _stand_in(tmp_path, taken_times=0, other_failure=True)
    monkeypatch.setattr(demo, "jaeger_binary", lambda: program)
    with pytest.raises(SystemExit, match="Jaeger exited; see .*jaeger.log"):
        demo.start_jaeger()
    assert _starts(tmp_path) == 1
    assert "not valid" in (tmp_path / "jaeger.log").read_text()
