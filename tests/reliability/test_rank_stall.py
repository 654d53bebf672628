"""Stall detection under a real ``horovodrun -np 4 --gloo`` with the real OTLP receiver: rank 3
stops forever before a step and rank 0 names it while the job runs; a control job with one step
3x the median on one rank raises nothing.

Each test prints one ``FIGURES`` line for docs/guides/RELIABILITY.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest
from conftest import REPO, VENV_BIN, base_env

from tf_otel import record
from tf_otel.otel.ids import step_trace_id

pytestmark = pytest.mark.integration

SCRIPT = str(REPO / "tests" / "reliability" / "scripts" / "stall_train.py")
KEY = "tf_function:train_step"
HANG_STEP = 6
FLOOR_S = 3.0  # TF_OTEL_STALL_FLOOR_S for these jobs: CI stays fast


def _command(np_: int) -> List[str]:
    return [
        str(VENV_BIN / "horovodrun"),
        "-np",
        str(np_),
        "-H",
        f"localhost:{np_}",
        "--gloo",
        str(VENV_BIN / "python"),
        SCRIPT,
    ]


def _env(receiver, **extra: str) -> Dict[str, str]:
    settings = {
        "TF_OTEL_ENABLED": "1",
        "TF_OTEL_ROOT_WAIT_MS": "1000",
        "TF_OTEL_STALL_FLOOR_S": str(FLOOR_S),
        "OTEL_LOGS_EXPORTER": "otlp",
    }
    return base_env(**receiver.env("grpc"), **{**settings, **extra})


def _descendants(pid: int) -> List[int]:
    """Every process below ``pid`` (from /proc), deepest last."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every rank it started, each by its pid."""
    for pid in [proc.pid] + _descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(30)


def _stalls(spans, state: str = record.STALLED):
    return [
        s
        for s in spans
        if s.category == record.STALL and s.attributes.get(record.ATTR_STALL_STATE) == state
    ]


def _in_flight(spans) -> Dict[int, object]:
    return {
        s.rank: s
        for s in spans
        if s.category == record.STEP and s.attributes.get(record.ATTR_STEP_IN_FLIGHT)
    }


def _figures(name: str, **values: object) -> None:
    print(f"FIGURES {name} " + " ".join(f"{k}={v}" for k, v in values.items()), file=sys.stderr)


def _await_stall(receiver, proc: subprocess.Popen, log, step=None):
    """The first stall record at the receiver (of ``step`` where given) while the job runs,
    and the wall-clock moment it was seen; fails with the job's output when none comes."""
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and proc.poll() is None:
        found = [
            s
            for s in _stalls(receiver.spans())
            if step is None or s.attributes[record.ATTR_STEP] == step
        ]
        if found:
            return found[0], time.time()
        time.sleep(0.1)
    log.seek(0)
    raise AssertionError(f"no stall record; job output:\n{log.read()[-4000:]}")


def test_a_rank_that_hangs_forever_is_named_while_the_job_runs(receiver, tmp_path) -> None:
    hang_file = tmp_path / "hang"
    log = (tmp_path / "job.log").open("w+")
    env = _env(
        receiver,
        STEPS="40",
        HANG_RANK="3",
        HANG_STEP=str(HANG_STEP),
        HANG_FILE=str(hang_file),
    )
    started = time.monotonic()
    proc = subprocess.Popen(
        _command(4), env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True
    )
    try:
        stall, received_at = _await_stall(receiver, proc, log, HANG_STEP)
        hang_at = float(hang_file.read_text())
        spans = receiver.wait_for(lambda s: {0, 1, 2} <= set(_in_flight(s)), 10)
        logs = receiver.wait_for_logs(lambda got: any("stalls" in str(x.body) for x in got), 10)
    finally:
        _kill_job(proc)
    log.seek(0)
    output = log.read()
    attrs = stall.attributes
    # the record names the hung rank and the step, in the step's own trace
    assert attrs[record.ATTR_STEP] == HANG_STEP and attrs[record.ATTR_STEP_KEY] == KEY
    assert list(attrs[record.ATTR_STALL_MISSING]) == [3], attrs
    assert list(attrs[record.ATTR_STALL_WAITING]) == [0, 1, 2], attrs
    assert list(attrs[record.ATTR_STALL_SILENT]) == [], attrs
    job_id = stall.resource[record.ATTR_JOB_ID]
    trace_id = f"{step_trace_id(job_id, KEY, HANG_STEP):032x}"
    assert stall.trace_id == trace_id
    # the hung rank's stack shows where it stopped; the others wait inside the step
    stack3 = next(s for s in attrs[record.ATTR_STALL_STACKS] if s.startswith("rank 3 "))
    assert "hang_forever (stall_train.py:" in stack3, stack3
    line3 = next(s for s in attrs[record.ATTR_STALL_RANKS] if s.startswith("rank 3:"))
    assert f"last completed step {HANG_STEP - 1}" in line3, line3
    (blocked,) = attrs[record.ATTR_STALL_BLOCKED_IN]  # one place: TF's execute, from the loop
    assert blocked.startswith("ranks 0-2: quick_execute (execute.py:"), blocked
    assert "called from <module> (stall_train.py:" in blocked, blocked
    # the collective they wait in: the step's one allreduce (the tape's gradient), learned when
    # train_step was traced; none can have completed, rank 3 never began the step
    (held,) = attrs[record.ATTR_STALL_COLLECTIVES]
    assert held.startswith("allreduce ") and "DistributedGradientTape" in held, held
    assert attrs[record.ATTR_STALL_COLLECTIVE_COUNT] == 1
    # detection: within the threshold + 10 s of the hang
    threshold_s = attrs[record.ATTR_STALL_THRESHOLD] / 1e9
    latency = received_at - hang_at
    assert threshold_s >= FLOOR_S
    assert latency <= threshold_s + 10, (latency, threshold_s)
    # the live ranks' step spans arrived, marked in flight, in the same trace
    flights = _in_flight(spans)
    for rank in (0, 1, 2):
        span = flights[rank]
        assert span.attributes[record.ATTR_STEP] == HANG_STEP
        assert span.trace_id == trace_id
        assert span.attributes[record.ATTR_STEP_IN_FLIGHT_REASON] == "stall"
    assert 3 not in flights
    # the log record: the same summary, in the step's trace, once on stderr
    stall_logs = [x for x in logs if "stalls" in str(x.body)]
    assert stall_logs, [x.body for x in logs][-5:]
    assert stall_logs[0].trace_id == trace_id and stall_logs[0].severity in ("WARN", "WARNING")
    assert "rank 3: has not reached step 6" in str(stall_logs[0].body)
    assert "none of them can have completed: ranks 3 have not begun it" in str(stall_logs[0].body)
    assert list(stall_logs[0].attributes[record.ATTR_STALL_MISSING]) == [3]
    assert stall_logs[0].attributes[record.ATTR_STEP] == HANG_STEP
    assert output.count(f"tf_otel: step {HANG_STEP} of {KEY} stalls") >= 1, output[-3000:]
    assert "Exception in thread" not in output and "tracing of this part" not in output
    early = [s.attributes[record.ATTR_STEP] for s in _stalls(spans) if s is not stall]
    assert not [step for step in early if step != HANG_STEP], early  # no false stall before
    _figures(
        "stall_hang",
        threshold_s=round(threshold_s, 2),
        detection_latency_s=round(latency, 1),
        in_flight_ranks=sorted(flights),
        wall_s=round(time.monotonic() - started, 1),
    )


def test_rank_0_stopped_between_steps_is_named_and_a_pause_of_all_ranks_is_not(
    receiver, tmp_path
) -> None:
    """Rank 0 stops forever before step 10 (between steps: the other ranks wait in step 10's
    allreduce). The control in the same job: every rank rests 8 s before step 4 (past two
    thresholds of 3 s, all between steps at once, as in an evaluation): no stall for it."""
    hang_file = tmp_path / "hang"
    log = (tmp_path / "job.log").open("w+")
    hang_step = 10
    env = _env(
        receiver,
        STEPS="40",
        STEP_SLEEP_S="0.05",
        HANG_RANK="0",
        HANG_STEP=str(hang_step),
        HANG_FILE=str(hang_file),
        ALL_PAUSE_STEP="4",
        ALL_PAUSE_S="8",
    )
    proc = subprocess.Popen(
        _command(4), env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True
    )
    try:
        stall, received_at = _await_stall(receiver, proc, log)  # the first, whatever its step
        hang_at = float(hang_file.read_text())
        spans = receiver.wait_for(lambda s: {1, 2, 3} <= set(_in_flight(s)), 10)
    finally:
        _kill_job(proc)
    attrs = stall.attributes
    assert attrs[record.ATTR_STEP] == hang_step, attrs  # none for the pause before step 4
    assert attrs[record.ATTR_STALL_RANK0_BETWEEN] is True
    assert list(attrs[record.ATTR_STALL_MISSING]) == [0], attrs
    assert list(attrs[record.ATTR_STALL_WAITING]) == [1, 2, 3], attrs
    trace_id = f"{step_trace_id(stall.resource[record.ATTR_JOB_ID], KEY, hang_step):032x}"
    assert stall.trace_id == trace_id
    stack0 = next(s for s in attrs[record.ATTR_STALL_STACKS] if s.startswith("rank 0 "))
    assert "hang_forever (stall_train.py:" in stack0, stack0
    (held,) = attrs[record.ATTR_STALL_COLLECTIVES]
    assert held.startswith("allreduce ") and "DistributedGradientTape" in held, held
    flights = _in_flight(spans)
    assert {flights[r].attributes[record.ATTR_STEP] for r in (1, 2, 3)} == {hang_step}
    assert not [s for s in _stalls(spans) if s.attributes[record.ATTR_STEP] != hang_step]
    threshold_s = attrs[record.ATTR_STALL_THRESHOLD] / 1e9
    latency = received_at - hang_at  # the others wait a threshold, then a probe, then a report
    assert latency <= 2 * threshold_s + 10, (latency, threshold_s)
    _figures(
        "stall_rank0_between",
        threshold_s=round(threshold_s, 2),
        detection_latency_s=round(latency, 1),
    )


def test_one_slow_step_raises_no_stall(receiver) -> None:
    """Control: rank 2's step 7 takes 3x the others (STEP_SLEEP_S 1.1 s: the slow step passes
    the 3 s floor, so only the factor x median keeps it from being a stall)."""
    env = _env(
        receiver, STEPS="9", STEP_SLEEP_S="1.1", SLOW_RANK="2", SLOW_STEP="7", SLOW_FACTOR="3"
    )
    started = time.monotonic()
    result = subprocess.run(
        _command(4), env=env, cwd=REPO, capture_output=True, text=True, timeout=150
    )
    wall = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    spans = receiver.wait_for(lambda s: False, 2)
    steps = {
        s.attributes[record.ATTR_STEP]: s
        for s in spans
        if s.category == record.STEP and s.rank == 0 and "train_step" in s.name
    }
    assert sorted(steps) == list(range(9)), sorted(steps)
    durations = {n: (s.end_ns - s.start_ns) / 1e9 for n, s in steps.items()}
    median = sorted(durations[n] for n in range(1, 7))[3]
    assert durations[7] > FLOOR_S, durations  # past the floor: the factor is what holds
    assert durations[7] >= 2.5 * median, durations
    assert not [s for s in spans if s.category == record.STALL]
    assert not _in_flight(spans)
    assert f"of {KEY} stalls" not in output
    _figures(
        "stall_control",
        slow_step_s=round(durations[7], 2),
        median_s=round(median, 2),
        wall_s=round(wall, 1),
    )


# -- live verdicts (issue 27 point 3): slowdowns and stragglers named on rank 0 while it runs ---

SLOWDOWN_FROM, SLOWDOWN_TO = 30, 55


def _slowdowns(spans, state: str) -> list:
    return [
        s
        for s in spans
        if s.category == record.SLOWDOWN and s.attributes[record.ATTR_SLOWDOWN_STATE] == state
    ]


def _roots(spans) -> Dict[int, Dict]:
    return {
        s.attributes[record.ATTR_STEP]: s.attributes
        for s in spans
        if s.category == record.STEP_ROOT and "train_step" in s.name
    }


def test_a_persistent_slowdown_of_one_rank_is_raised_once_and_closed(receiver) -> None:
    """Rank 1 begins steps 30..54 150 ms late (steps of ~10 ms): rank 0 raises one slowdown
    naming rank 1 within 10 steps of its start (6 late steps pass the 1-s floor), with a log
    record in the trace of the step it began at, closes it once the rank is back, and names
    rank 1 on those steps' roots."""
    env = _env(
        receiver,
        STEPS="80",
        STEP_SLEEP_S="0.01",
        SLOWDOWN_RANK="1",
        SLOWDOWN_FROM=str(SLOWDOWN_FROM),
        SLOWDOWN_TO=str(SLOWDOWN_TO),
        SLOWDOWN_S="0.15",
    )
    result = subprocess.run(
        _command(4), env=env, cwd=REPO, capture_output=True, text=True, timeout=200
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    spans = receiver.wait_for(lambda s: len(_roots(s)) >= 80 and _slowdowns(s, record.ENDED), 15)
    began, ended = _slowdowns(spans, record.BEGAN), _slowdowns(spans, record.ENDED)
    # a step-time slowdown raised a step before the rank's explained it is closed, never left open
    step_time = [s for s in began + ended if record.ATTR_SLOWDOWN_RANK not in s.attributes]
    assert len(step_time) in (0, 2), [s.attributes for s in began + ended]
    began, ended = (
        [s for s in began if s not in step_time],
        [s for s in ended if s not in step_time],
    )
    assert len(began) == 1 and len(ended) == 1, [s.attributes for s in began + ended]
    raised = began[0].attributes
    assert raised[record.ATTR_SLOWDOWN_RANK] == 1, raised
    since, at = raised[record.ATTR_SLOWDOWN_SINCE], raised[record.ATTR_SLOWDOWN_AT]
    assert SLOWDOWN_FROM <= since <= SLOWDOWN_FROM + 2 and at <= SLOWDOWN_FROM + 10, raised
    assert 130e6 <= raised[record.ATTR_SLOWDOWN_LATENESS] <= 190e6, raised  # the 150 ms it sleeps
    job_id = began[0].resource[record.ATTR_JOB_ID]
    assert began[0].trace_id == f"{step_trace_id(job_id, KEY, since):032x}"
    closed = ended[0].attributes
    assert closed[record.ATTR_SLOWDOWN_RANK] == 1 and closed[record.ATTR_SLOWDOWN_SINCE] == since
    assert SLOWDOWN_TO <= closed[record.ATTR_SLOWDOWN_AT] <= SLOWDOWN_TO + 10, closed
    # each inside the root of the step whose trace it is in (a backend draws it there)
    root_spans = {
        s.attributes[record.ATTR_STEP]: s
        for s in spans
        if s.category == record.STEP_ROOT and "train_step" in s.name
    }
    for span, step in ((began[0], since), (ended[0], closed[record.ATTR_SLOWDOWN_AT])):
        root = root_spans[step]
        assert span.parent_id == root.span_id, (span.attributes, step)
        assert root.start_ns <= span.start_ns <= span.end_ns <= root.end_ns, (span, root)
    logs = receiver.wait_for_logs(lambda got: any("slowdown" in str(x.body) for x in got), 10)
    raised_log = [x for x in logs if "rank 1 slowdown:" in str(x.body)]
    assert raised_log and raised_log[0].trace_id == began[0].trace_id, [x.body for x in logs]
    assert f"since step {since} of {KEY}" in str(raised_log[0].body)
    # the roots of the slowed steps name rank 1, begun late; the others nobody but real ones
    roots = _roots(spans)
    named = {n: a.get(record.ATTR_STRAGGLER_RANK) for n, a in roots.items()}
    slowed = range(SLOWDOWN_FROM, SLOWDOWN_TO)
    seen = {
        n: (
            roots[n].get(record.ATTR_STRAGGLER_RANK),
            roots[n].get(record.ATTR_STRAGGLER_LATENESS),
            roots[n].get(record.ATTR_STRAGGLER_THRESHOLD),
            roots[n].get(record.ATTR_STRAGGLER_MEASURED),
        )
        for n in range(SLOWDOWN_FROM - 5, SLOWDOWN_TO + 5)
    }
    assert sum(named[n] == 1 for n in slowed) >= 0.8 * len(slowed), "\n".join(
        f"step {n}: rank, lateness, threshold, measured = {v}" for n, v in seen.items()
    )
    for n in slowed:
        if named[n] == 1:
            assert roots[n][record.ATTR_STRAGGLER_CATEGORY] == "before_step", roots[n]
    _figures("slowdown", since=since, raised_at=at, ended_at=closed[record.ATTR_SLOWDOWN_AT])


def test_a_long_control_raises_no_slowdown(receiver, tmp_path) -> None:
    """1,000 steps of 4 ranks with nothing injected: no slowdown, the roots judged, and a root
    that names a rank (this shared host descheduling one) names one that really began late."""
    truth = tmp_path / "begun-{rank}.json"
    env = _env(receiver, STEPS="1000", STEP_SLEEP_S="0", QUIET="1", TRUTH_FILE=str(truth))
    result = subprocess.run(
        _command(4), env=env, cwd=REPO, capture_output=True, text=True, timeout=400
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    spans = receiver.wait_for(lambda s: len(_roots(s)) >= 1000, 30)
    roots = _roots(spans)
    judged = [n for n, a in roots.items() if record.ATTR_STRAGGLER_THRESHOLD in a]
    assert len(judged) >= 990, len(judged)
    assert not [s.attributes for s in spans if s.category == record.SLOWDOWN]
    named = sorted(n for n, a in roots.items() if record.ATTR_STRAGGLER_RANK in a)
    truths = {
        r: json.loads(Path(str(truth).replace("{rank}", str(r))).read_text()) for r in range(4)
    }

    def late_ms(kind: str, n: int, rank: int) -> float:
        """How much later than the other three's median the rank reached that point of step n."""
        others = sorted(truths[r][kind][n] for r in range(4) if r != rank)
        return (truths[rank][kind][n] - others[1]) / 1e6

    unconfirmed = []
    for n in named:  # judged from the extents: the rank began the step (or got its input) late
        attributes = roots[n]
        rank = attributes[record.ATTR_STRAGGLER_RANK]
        # tf_otel's step begin lies between the script's call and the graph's first op: a rank
        # descheduled between the call and the begin is late by the second truth only (CI:
        # named 19+ ms late at step 519, 9.4 ms late at the call)
        late = max(late_ms("begun", n, rank), late_ms("entered", n, rank))
        if attributes[record.ATTR_STRAGGLER_MEASURED] == "extents":
            if late < 0.5 * attributes[record.ATTR_STRAGGLER_LATENESS] / 1e6:
                unconfirmed.append((n, rank, round(late, 1), attributes))
    assert not unconfirmed, unconfirmed
    _figures("slowdown_control", steps=len(roots), named_roots=len(named))
