"""A program that exits while its detail twin is traced on the twin thread does not wait for
that trace (issue 45): the pacer raises into the trace at the exit and the twin thread ends.
Real TensorFlow, tf_otel on, one process (tests/reliability/scripts/twin_exit.py):

- a trace that would take 300 s: the program ends within seconds of its last line, the twin
  counted as abandoned, nothing prepared, no traceback on stderr;
- control: a quick trace is prepared before the exit and nothing is abandoned.
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO, base_env, python, run

pytestmark = pytest.mark.integration

SCRIPT = REPO / "tests" / "reliability" / "scripts" / "twin_exit.py"


def _job(trace_s: float):
    env = base_env(
        TF_OTEL_ENABLED="1",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        TRACE_S=str(trace_s),
    )
    result = run([python(), str(SCRIPT)], env, timeout=300)
    lines = result.stdout.splitlines()
    exiting = float(next(x for x in lines if x.startswith("exiting ")).split()[1])
    exited = float(next(x for x in lines if x.startswith("exited ")).split()[1])
    report = json.loads(next(x for x in lines if x.startswith("EXIT ")).split(" ", 1)[1])
    return exited - exiting, report, result.stderr


def test_an_exit_abandons_a_twin_trace_under_way():
    waited, report, stderr = _job(300.0)
    assert waited < 10.0, (waited, report)
    assert report["counters"].get("twin_abandoned_at_exit") == 1, report
    queued, prepared, _ = report["gens"]
    assert queued == 1 and prepared == 0, report
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "tracing of this part is skipped" not in stderr, stderr[-3000:]  # no fail-open report


def test_control_a_quick_trace_is_prepared_and_nothing_abandoned():
    waited, report, stderr = _job(0.5)
    assert not report["counters"].get("twin_abandoned_at_exit"), report
    queued, prepared, _ = report["gens"]
    assert queued == prepared == 1, report
    assert waited < 10.0, waited
