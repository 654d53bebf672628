"""tf_otel's operator lines reach stderr exactly once, whatever logging is set up, and also go
through the OTel log pipeline.

Real training loop (examples/custom_loop.py), real `opentelemetry-instrument` with the distro's
logging handler on the root logger (OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED=true), a
real OTLP receiver for the log records, a collector that accepts and never answers (hanging),
and a program that calls `logging.basicConfig()` itself. A span file under /proc cannot be created
even as root (DESIGN.md §10).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from conftest import EXAMPLES, VENV_BIN, base_env, run
from otlp_receiver import HangingCollector, OtlpReceiver

from tf_otel import stderr_once

UNWRITABLE = "/proc/tf-otel-no-such-dir/spans-{rank}.jsonl"
LOST = "tf_otel: spans were lost:"
INSTRUMENT = str(VENV_BIN / "opentelemetry-instrument")


@pytest.fixture
def hanging() -> Iterator[HangingCollector]:
    server = HangingCollector()
    yield server
    server.close()


def _distro_logging(receiver: OtlpReceiver) -> Dict[str, str]:
    """The distro's own logging set-up: its LoggingHandler on root, records over OTLP/gRPC."""
    return {
        "OTEL_LOGS_EXPORTER": "otlp",
        "OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED": "true",
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": f"http://127.0.0.1:{receiver.grpc_port}",
        "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BLRP_SCHEDULE_DELAY": "200",
        "OTEL_METRICS_EXPORTER": "none",
    }


def _train(command: List[str], env: Dict[str, str], steps: int = 5) -> subprocess.CompletedProcess:
    result = run(command, {**env, "STEPS": str(steps)}, timeout=180)
    assert f"done steps={steps}" in result.stdout, result.stderr[-3000:]  # training went on
    return result


def _file_lines(stderr: str) -> List[str]:
    return [line for line in stderr.splitlines() if "TF_OTEL_FILE=" in line]


# ----------------------------------------------------------------------------------------------
# the handler's rule, in process


def _logger_with(handler: logging.Handler, name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.propagate = False  # an isolated chain: this logger and its handlers only
    logger.handlers = [stderr_once._HANDLER, handler]
    return logger


@pytest.mark.parametrize(
    "make",
    [
        lambda: logging.StreamHandler(sys.stderr),  # the program prints it, ours stays quiet
        lambda: logging.StreamHandler(sys.stdout),  # stdout is not stderr: ours prints
        lambda: logging.NullHandler(),  # e.g. the distro's OTLP handler: ours prints
        lambda: _level(logging.StreamHandler(sys.stderr), logging.ERROR),  # skips warnings
    ],
    ids=["program-stderr", "program-stdout", "non-stream", "stderr-at-error"],
)
def test_the_line_reaches_stderr_exactly_once(capsys, make):
    other = make()
    logger = _logger_with(other, f"tf_otel.test_rule.{id(other)}")
    logger.warning("tf_otel: a line for the operator")
    assert capsys.readouterr().err.count("tf_otel: a line for the operator") == 1


def _level(handler: logging.Handler, level: int) -> logging.Handler:
    handler.setLevel(level)
    return handler


def test_install_is_idempotent_and_covers_the_exporter_loggers():
    stderr_once.install()
    stderr_once.install()
    for name in stderr_once.LOGGERS:
        assert logging.getLogger(name).handlers.count(stderr_once._HANDLER) == 1, name


# ----------------------------------------------------------------------------------------------
# real runs


@pytest.mark.integration
def test_unwritable_file_is_one_line_without_a_wrapper():
    env = base_env(TF_OTEL_ENABLED="1", OTEL_TRACES_EXPORTER="none", TF_OTEL_FILE=UNWRITABLE)
    result = _train([str(VENV_BIN / "python"), str(EXAMPLES / "custom_loop.py")], env)
    lines = _file_lines(result.stderr)
    assert len(lines) == 1, result.stderr[-3000:]
    assert "/proc/tf-otel-no-such-dir/spans-0.jsonl" in lines[0]
    assert "cannot be written" in lines[0]


@pytest.mark.integration
def test_unwritable_file_under_opentelemetry_instrument_reaches_stderr_and_otlp_logs():
    with OtlpReceiver() as receiver:
        env = base_env(
            **_distro_logging(receiver), OTEL_TRACES_EXPORTER="none", TF_OTEL_FILE=UNWRITABLE
        )
        result = _train([INSTRUMENT, "python", str(EXAMPLES / "custom_loop.py")], env)
        lines = _file_lines(result.stderr)
        assert len(lines) == 1, result.stderr[-3000:]
        assert "/proc/tf-otel-no-such-dir/spans-0.jsonl" in lines[0]
        logs = receiver.wait_for_logs(
            lambda logs: any("TF_OTEL_FILE=" in str(r.body) for r in logs), timeout_s=20
        )
        found = [r for r in logs if "TF_OTEL_FILE=" in str(r.body)]
        assert len(found) == 1, [r.body for r in logs]
        assert found[0].severity == "WARN"


@pytest.mark.integration
def test_control_a_writable_file_says_nothing(tmp_path: Path):
    with OtlpReceiver() as receiver:
        path = tmp_path / "new-dir" / "spans-{rank}.jsonl"  # a missing directory is created
        env = base_env(
            **_distro_logging(receiver), OTEL_TRACES_EXPORTER="none", TF_OTEL_FILE=str(path)
        )
        result = _train([INSTRUMENT, "python", str(EXAMPLES / "custom_loop.py")], env)
        assert not _file_lines(result.stderr), result.stderr[-3000:]
        assert LOST not in result.stderr
        assert (tmp_path / "new-dir" / "spans-0.jsonl").stat().st_size > 0


@pytest.mark.integration
def test_hanging_collector_under_opentelemetry_instrument_says_lost_spans_once(hanging):
    with OtlpReceiver() as receiver:
        env = base_env(
            **_distro_logging(receiver),
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"http://127.0.0.1:{hanging.port}",
            OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="grpc",
            OTEL_BSP_SCHEDULE_DELAY="200",
            TF_OTEL_EXIT_TIMEOUT_S="2",
        )
        result = _train([INSTRUMENT, "python", str(EXAMPLES / "custom_loop.py")], env, steps=50)
        assert result.stderr.count(LOST) == 1, result.stderr[-3000:]
        assert result.stderr.count("span export is failing") <= 1
        assert hanging.conns, "the exporter never connected"


@pytest.mark.integration
def test_program_that_configures_logging_sees_each_line_once(tmp_path: Path, hanging):
    """The program's own root stderr handler prints tf_otel's lines (in its format); tf_otel's
    handler stays quiet, so nothing is doubled."""
    program = tmp_path / "own_logging.py"
    program.write_text(
        "import logging, runpy, sys\n"
        "logging.basicConfig(level=logging.INFO, format='PROGRAM %(levelname)s %(message)s')\n"
        f"sys.argv = [{str(EXAMPLES / 'custom_loop.py')!r}]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    env = base_env(
        TF_OTEL_ENABLED="1",
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{hanging.port}",
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_BSP_SCHEDULE_DELAY="200",
        TF_OTEL_EXIT_TIMEOUT_S="2",
    )
    result = _train([str(VENV_BIN / "python"), str(program)], env, steps=50)
    lost = [line for line in result.stderr.splitlines() if LOST in line]
    assert len(lost) == 1, result.stderr[-3000:]
    assert re.match(r"PROGRAM WARNING tf_otel: spans were lost", lost[0]), lost
