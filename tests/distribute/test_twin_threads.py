"""The threads a detail twin's trace starts are paced like the trace (issue 45): MirroredStrategy
traces each replica's function on a thread of its own, so most of a twin's Python runs there.
Real TensorFlow, MirroredStrategy over 2 logical CPU devices, tf_otel on by default, one process:

- the program's own trace (its first call) runs its replica threads unpaced;
- the twin's trace on the ``tf_otel-twin`` thread runs its replica threads each with a pacer;
- control: with the twin traced on the step (``TF_OTEL_TWIN_PREPARE=step``, no pacer), no
  replica thread is paced;
- a program that exits while the twin's replica thread is inside a slow trace ends within
  seconds: Abandoned is raised inside the replica's function, handed back to the twin thread by
  MirroredStrategy's coordinator, counted as abandoned; no thread traceback, no fail-open report.
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO, base_env, python, run

pytestmark = pytest.mark.integration

SCRIPT = REPO / "tests" / "distribute" / "scripts" / "twin_threads_job.py"


def _run(**extra: str):
    env = base_env(
        TF_OTEL_ENABLED="1",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        **extra,
    )
    return run([python(), str(SCRIPT)], env, timeout=400)


def _job(**extra: str):
    result = _run(**extra)
    line = next(x for x in result.stdout.splitlines() if x.startswith("THREADS "))
    return json.loads(line.split(" ", 1)[1])


@pytest.mark.parametrize("where", ["background", "step"])
def test_a_twins_replica_threads_are_paced_and_the_programs_are_not(where):
    report = _job(TF_OTEL_TWIN_PREPARE=where)
    queued, prepared, _ = report["generations"]
    noted = report["noted"]
    assert all(kind == "_MirroredReplicaThread" for kind, _ in noted), noted
    # the program's trace (2 replicas), then the twin's (2 replicas)
    assert len(noted) == 4, noted
    assert [paced for _, paced in noted[:2]] == ["NoneType", "NoneType"], noted
    if where == "background":
        assert queued == prepared == 1, report
        assert [paced for _, paced in noted[2:]] == ["Pacer", "Pacer"], noted
    else:  # the control: traced on the step, nothing paced
        assert [paced for _, paced in noted[2:]] == ["NoneType", "NoneType"], noted


def test_an_exit_abandons_a_twin_trace_inside_its_replica_thread():
    result = _run(TRACE_S="300")
    lines = result.stdout.splitlines()
    exiting = float(next(x for x in lines if x.startswith("exiting ")).split()[1])
    exited = float(next(x for x in lines if x.startswith("exited ")).split()[1])
    counters = json.loads(next(x for x in lines if x.startswith("EXIT ")).split(" ", 1)[1])
    assert exited - exiting < 15.0, (exited - exiting, counters)
    assert counters.get("twin_abandoned_at_exit") == 1, counters
    assert "Exception in thread" not in result.stderr, result.stderr[-3000:]
    assert "tracing of this part is skipped" not in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
