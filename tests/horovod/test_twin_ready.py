"""The detail twin's preparation off the training thread, real horovodrun -np 2 (issue 45).

The script's twin takes seconds to trace (its Python sleeps inside a twin's trace), so the
policy picks steps before the twin is ready:

- every rank traces the twin on the twin thread, never on the training thread, and TensorFlow
  instantiates it there without running it;
- a picked step before the twin is prepared on both ranks runs the program's own function on
  both ranks, has no collective span and says so (``tf_otel.detail.twin = preparing``), step 0
  too (the function's first call: the program's own trace, not the twin's, on that step);
- the first picked step that runs the twin is the same step on both ranks, and every picked
  step after it runs the twin on both ranks; steps not picked never do.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import base_env, horovodrun  # noqa: E402
from detail_steps import job_with_detail  # noqa: E402

from tf_otel import record  # noqa: E402
from tf_otel.instrument.horovod.collective_source import detail_wanted  # noqa: E402
from tf_otel.otel.ids import step_trace_id  # noqa: E402

pytestmark = pytest.mark.integration
SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "twin_ready_loop.py")
KEY = "tf_function:train_step"
STEPS = 60
EVERY = 3


# step 0 picked too: the function's first call, which runs the program's own function
JOB = next(
    job
    for job in (job_with_detail(KEY, range(STEPS), EVERY, f"ready{i}") for i in range(100))
    if detail_wanted(step_trace_id(job, KEY, 0), EVERY)
)


def reports(stdout: str):
    lines = [line for line in stdout.splitlines() if "TWIN " in line]
    found = [json.loads(line.split("TWIN ", 1)[1]) for line in lines]
    assert sorted(r["rank"] for r in found) == [0, 1], stdout[-3000:]
    return found


def test_picked_steps_wait_for_the_twin_on_every_rank_and_agree_on_the_first(receiver, tmp_path):
    env = base_env(
        **receiver.env("grpc"),
        TF_OTEL_ENABLED="1",
        STEPS=str(STEPS),
        TRACE_SLEEP_S="1.0",
        STEP_SLEEP_S="0.1",
        TMPDIR=str(tmp_path),
        TF_OTEL_HOROVOD_EVERY=str(EVERY),
        TF_OTEL_JOB_ID=JOB,
    )
    result = horovodrun(SCRIPT, env, timeout=400)
    for report in reports(result.stdout):
        twin_traces = [name for inside, name in report["traced_on"] if inside]
        assert twin_traces and all(name == "tf_otel-twin" for name in twin_traces), report
        assert report["main"] not in twin_traces
        assert [name for inside, name in report["traced_on"] if not inside] == [report["main"]]
        counters = report["counters"]
        assert counters.get("twin_instantiated", 0) >= 1, report
        assert not counters.get("twin_instantiate_ran"), report
        assert not counters.get("twin_traced_on_step"), report
        assert not counters.get("twin_open_late"), report
        assert counters.get("twin_detail_deferred", 0) >= 1, report
    spans = receiver.wait_for(lambda s: False, 4.0)
    steps = [s for s in spans if s.category == "step" and "train_step" in s.name]
    by_key = {(s.attributes["tf_otel.step"], s.rank): s for s in steps}
    assert set(by_key) == {(n, r) for n in range(STEPS) for r in (0, 1)}
    by_id = {s.span_id: s for s in spans}
    timed = defaultdict(set)  # step -> ranks with collective spans
    for c in (s for s in spans if s.category == "collective"):
        parent = by_id[c.parent_id]
        timed[parent.attributes["tf_otel.step"]].add(parent.rank)
    picked = sorted(
        n for n in range(STEPS) if detail_wanted(int(by_key[(n, 0)].trace_id, 16), EVERY)
    )
    deferred = defaultdict(set)  # step -> ranks whose span says "preparing"
    for (n, rank), span in by_key.items():
        if span.attributes.get(record.ATTR_DETAIL_TWIN) == record.DETAIL_TWIN_PREPARING:
            deferred[n].add(rank)
    assert set(deferred) <= set(picked), "only picked steps are deferred"
    assert set(timed) <= set(picked), "collectives only on picked steps"
    for n in picked:
        assert deferred.get(n, set()) in (set(), {0, 1}), (n, deferred[n])
        assert timed.get(n, set()) in (set(), {0, 1}), (n, timed[n])
        assert bool(deferred.get(n)) != bool(timed.get(n)), (n, "deferred xor detailed")
    assert deferred and timed, (sorted(deferred), sorted(timed))
    assert deferred.get(0) == {0, 1}, "the first call, picked, ran the program's function"
    first = min(timed)
    assert max(deferred) < first, "every picked step after the first twin step runs the twin"
    assert {n for n in picked if n >= first} == set(timed)
