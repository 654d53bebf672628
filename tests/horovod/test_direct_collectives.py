"""The program's own ``hvd.allreduce`` calls in one tf.function (issue 23 points 1 and 2), real
horovodrun -np 2, real OTLP receiver:

- collective detail runs in a twin of the program's function: the program's own trace holds no
  timing op (no standing cost on steps without detail), the twin holds them;
- the stamps add no order between independent collectives (plain ``tf.timestamp`` ops chained
  all of them: 10 ordered pairs of 5, measured before the fix);
- every own call is timed on both ranks in every detail step, with the rank's own arrival, and
  on no other step; with nothing set, on the steps the default policy picks.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import base_env, horovodrun  # noqa: E402
from detail_steps import STEP_PREPARE, detailed_steps, job_with_detail  # noqa: E402

from tf_otel.config import HOROVOD_EVERY_DEFAULT  # noqa: E402
from tf_otel.instrument.horovod.collective_source import detail_wanted  # noqa: E402

pytestmark = pytest.mark.integration
SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "direct_collectives.py")
CALLS = 5
KEY = "tf_function:train_step"  # the step key of the script's tf.function


def graphs(stdout: str):
    lines = [line for line in stdout.splitlines() if "GRAPHS " in line]
    reports = [json.loads(line.split("GRAPHS ", 1)[1]) for line in lines]
    assert sorted(r["rank"] for r in reports) == [0, 1], stdout[-2000:]
    return reports


@pytest.mark.parametrize("every", [1, 2, None], ids=["every1", "every2", "default"])
def test_own_collectives_timed_in_a_twin_without_order(receiver, tmp_path, every):
    steps_n = 12
    env = base_env(
        **receiver.env("grpc"),
        TF_OTEL_ENABLED="1",
        STEPS=str(steps_n),
        TMPDIR=str(tmp_path),
        **STEP_PREPARE,  # every picked step detailed (background: tests/horovod/test_twin_ready)
    )
    if every is None:  # the defaults: detail on 1 sampled step in HOROVOD_EVERY_DEFAULT
        every = HOROVOD_EVERY_DEFAULT
    else:
        env["TF_OTEL_HOROVOD_EVERY"] = str(every)
        env["TF_OTEL_HOROVOD_FUSED"] = "0"  # dense detail: one span a call, to check each
    if every > 1:
        env["TF_OTEL_JOB_ID"] = job_with_detail(KEY, range(steps_n), every, "direct")
    result = horovodrun(SCRIPT, env)  # an absolute path: not under examples/
    for report in graphs(result.stdout):
        assert report["program_timing_ops"] == 0, report  # the program's graph untouched
        assert report["twin_collectives"] == CALLS, report
        assert report["twin_timing_ops"] >= CALLS, report
        assert report["ordered_pairs"] == 0, report
    spans = receiver.wait_for(lambda s: False, 4.0)
    steps = [s for s in spans if s.category == "step" and "train_step" in s.name]
    assert {(s.attributes["tf_otel.step"], s.rank) for s in steps} == {
        (n, r) for n in range(steps_n) for r in (0, 1)
    }
    picked = {
        s.attributes["tf_otel.step"] for s in steps if detail_wanted(int(s.trace_id, 16), every)
    }
    detail = detailed_steps(picked)
    by_id = {s.span_id: s for s in spans}
    timed = defaultdict(set)  # (step, rank) -> tensors
    for c in (s for s in spans if s.category == "collective"):
        parent = by_id[c.parent_id]
        assert parent.rank == c.rank
        assert c.attributes["horovod.arrival"] == "stamp", c.attributes
        timed[(parent.attributes["tf_otel.step"], c.rank)].add(c.attributes["horovod.tensor"])
    want = {f"direct_{i}" for i in range(CALLS)}
    assert picked and len(detail) < steps_n or every == 1, detail
    for step in detail:
        for rank in (0, 1):
            got = {name.rsplit("/", 1)[-1] for name in timed.get((step, rank), set())}
            assert got == want, (step, rank, got)
    assert {step for step, _ in timed} == detail, "collectives on the detail steps only"
