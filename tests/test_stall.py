"""Stall detection without TensorFlow: the threshold and back-off, the record rank 0 builds from
the ranks' answers, a rank's answer (its real stack), and three in-process ranks over the real
coordinator TCP link where one rank stops: rank 0 names it, then closes the stall."""

from __future__ import annotations

import threading
import time
from typing import List, Tuple

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ports import free_port_pair

from tf_otel import record
from tf_otel.cluster import messages, stall, stall_record
from tf_otel.config import Settings
from tf_otel.job.topology import Topology
from tf_otel.otel.ids import step_root_span_id, step_trace_id
from tf_otel.runtime.steps import Pipeline

S = 1_000_000_000
KEY = "tf_function:train_step"


def test_threshold_floor_factor_and_warm_up() -> None:
    policy = stall.Policy(floor_s=20.0, factor=10.0)
    assert policy.threshold_ns([]) == 120 * S  # warm-up: 6 x the floor
    assert policy.threshold_ns([S // 10] * 2) == 120 * S
    assert policy.threshold_ns([S // 10] * 3) == 20 * S  # short steps: the floor
    assert policy.threshold_ns([5 * S] * 10) == 50 * S  # long steps: 10 x the median
    # the median, not the mean: one slow step does not raise the threshold
    assert policy.threshold_ns([S] * 9 + [300 * S]) == 20 * S


def test_defaults_meet_the_promises() -> None:
    """Steps < 1 s: named <= 30 s after the hang began; a step 3x (even 9x) the median: never."""
    settings = Settings()
    policy = stall.Policy(settings.stall_floor_s, settings.stall_factor)
    for median_ms in (1, 10, 100, 500, 999, 1000, 3000, 60_000):
        durations = [median_ms * 1_000_000] * 20
        threshold = policy.threshold_ns(durations)
        assert 9 * median_ms * 1_000_000 < threshold  # a slow step of 3x, even 9x: no stall
        if median_ms < 1000:
            worst = threshold / S + stall.CHECK_INTERVAL_S + stall.ANSWER_WAIT_S
            assert worst <= 30, (median_ms, worst)


def test_a_step_that_traces_is_told_from_one_that_waits() -> None:
    tf = "/venv/lib/python3.11/site-packages/tensorflow/python"
    tracing = [
        ["converted_call", f"{tf}/autograph/impl/api.py", 439],
        ["func_graph_from_py_func", f"{tf}/framework/func_graph.py", 1059],
        ["_create_concrete_function", f"{tf}/eager/polymorphic_function/tracing_compilation.py", 9],
        ["<module>", "/job/train.py", 70],
    ]
    assert stall.is_tracing(tracing)
    assert not stall.is_tracing(WAITING_STACK) and not stall.is_tracing([])
    calling = [  # every tf.function call passes through tracing_compilation: not a trace
        ["quick_execute", f"{tf}/eager/execute.py", 53],
        ["call_function", f"{tf}/eager/polymorphic_function/tracing_compilation.py", 139],
        ["<module>", "/job/train.py", 70],
    ]
    assert not stall.is_tracing(calling)


def test_reports_back_off() -> None:
    t = 10 * S
    assert [stall.report_due_ns(t, k) // S for k in (1, 2, 3, 4)] == [10, 20, 40, 80]
    far = stall.report_due_ns(t, 12)
    before = stall.report_due_ns(t, 11)
    assert far - before == int(stall.MAX_REPORT_GAP_S * S)  # the gap is capped


def _answer(flight, done, stack, name="tf.function train_step") -> messages.Message:
    body = {"t": messages.STALL_WHERE, "q": 1, "f": flight, "d": done, "n": name, "s": stack}
    return messages.decode(messages.encode(body))  # what rank 0 receives, checked


WAITING_STACK = [
    ["quick_execute", "/venv/lib/python3.12/site-packages/tensorflow/eager/execute.py", 53],
    ["run_step", stall_record._OWN_DIR + "/instrument/_patching.py", 143],
    ["<module>", "/job/train.py", 70],
]
HUNG_STACK = [["hang_forever", "/job/train.py", 40], ["<module>", "/job/train.py", 66]]


def test_record_names_the_missing_rank_the_waiting_place_and_the_silent() -> None:
    answers = {
        0: _answer([KEY, 8, 21 * S], [KEY, 7, 21 * S], WAITING_STACK),
        1: _answer([KEY, 8, 21 * S], [KEY, 7, 21 * S], WAITING_STACK),
        2: _answer([KEY, 8, 21 * S], [KEY, 7, 21 * S], WAITING_STACK),
        3: _answer(None, [KEY, 7, 21 * S], HUNG_STACK, name=""),
    }
    built = stall_record.build_record(KEY, 8, 6, 21 * S, 20 * S, 1, answers, connected={1, 2, 3, 4})
    attrs = built.attributes
    assert attrs[record.ATTR_CATEGORY] == record.STALL
    assert attrs[record.ATTR_STALL_STATE] == record.STALLED
    assert (attrs[record.ATTR_STEP], attrs[record.ATTR_STEP_KEY]) == (8, KEY)
    assert attrs[record.ATTR_STALL_MISSING] == [3]
    assert attrs[record.ATTR_STALL_WAITING] == [0, 1, 2]
    assert attrs[record.ATTR_STALL_SILENT] == [4, 5]
    assert attrs[record.ATTR_STALL_BLOCKED_IN] == [
        "ranks 0-2: quick_execute (execute.py:53) called from <module> (train.py:70)"
    ]
    lines = attrs[record.ATTR_STALL_RANKS]
    assert lines[0].startswith("rank 3: has not reached step 8 (last completed step 7 21.0 s ago)")
    assert "at hang_forever (train.py:40) called from <module> (train.py:66)" in lines[0]
    assert "rank 4: did not answer within 2 s (stuck in C++ holding the GIL, or dead)" in lines
    assert "rank 5: not connected to rank 0 (dead, or never reached rank 0)" in lines
    stacks = attrs[record.ATTR_STALL_STACKS]
    assert stacks[0] == (
        "rank 3 (innermost first):\n  hang_forever (train.py:40)\n  <module> (train.py:66)"
    )
    assert len(stacks) == 4  # the silent ranks have none
    assert "step 8 of tf_function:train_step stalls: rank 0 has been in it 21.0 s" in built.summary
    assert "Not in the step: rank 3: has not reached step 8" in built.summary
    assert "Did not answer: 4-5." in built.summary


def test_record_done_idle_and_other_step_and_bounds() -> None:
    answers = {
        0: _answer([KEY, 8, S], [KEY, 7, S], WAITING_STACK),
        1: _answer(None, [KEY, 8, S], HUNG_STACK),  # finished the step: not missing
        2: _answer(None, None, HUNG_STACK),  # never stepped: a parameter server
        3: _answer(["keras_evaluate", 2, S], [KEY, 5, S], HUNG_STACK),  # elsewhere
    }
    built = stall_record.build_record(KEY, 8, 4, 21 * S, 20 * S, 3, answers, connected={1, 2, 3})
    assert built.missing == [3] and built.waiting == [0] and built.silent == []
    lines = built.attributes[record.ATTR_STALL_RANKS]
    assert any(x.startswith("rank 3: has not reached step 8 (last completed step 5") for x in lines)
    assert any("in step 2 of keras_evaluate" in x for x in lines)
    assert any(x.startswith("rank 1: finished step 8") for x in lines)
    assert any(x.startswith("rank 2: has never stepped") for x in lines)
    # a big job: detail for at most MAX_DETAIL_RANKS ranks, the waiting grouped by place
    many = {r: _answer([KEY, 8, S], [KEY, 7, S], WAITING_STACK) for r in range(1, 512)}
    many[0] = _answer([KEY, 8, S], [KEY, 7, S], WAITING_STACK)
    big = stall_record.build_record(
        KEY, 8, 513, 21 * S, 20 * S, 1, many, connected=set(range(1, 513))
    )
    assert big.missing == [] and big.silent == [512]
    assert len(big.attributes[record.ATTR_STALL_RANKS]) == stall_record.MAX_DETAIL_RANKS
    assert big.attributes[record.ATTR_STALL_BLOCKED_IN][0].startswith("ranks 0-511: ")


def test_ranks_past_the_step_are_done_and_rank_0_named_as_the_holder() -> None:
    """Rank 0 stuck in its own work after the collectives (or a ps worker behind the others):
    ranks already in a later step finished this one; they are not 'not reached'."""
    answers = {
        0: _answer([KEY, 8, 21 * S], [KEY, 7, 21 * S], HUNG_STACK),
        1: _answer([KEY, 9, 20 * S], [KEY, 8, 20 * S], WAITING_STACK),
        2: _answer([KEY, 12, S], [KEY, 11, S], WAITING_STACK),
    }
    built = stall_record.build_record(KEY, 8, 3, 21 * S, 20 * S, 1, answers, connected={1, 2})
    assert built.missing == [] and built.waiting == [0] and built.silent == []
    lines = built.attributes[record.ATTR_STALL_RANKS]
    assert any(x.startswith("rank 1: finished step 8, in step 9 of") for x in lines), lines
    assert any(x.startswith("rank 2: finished step 11, in step 12 of") for x in lines), lines
    assert "rank 0 itself holds it" in built.summary


def test_resolved_record_says_a_slow_step() -> None:
    built = stall_record.resolved_record(KEY, 8, 31 * S, 20 * S, 1, None)
    assert built.attributes[record.ATTR_STALL_STATE] == record.RESOLVED
    assert built.attributes[record.ATTR_STALL_DURATION] == 31 * S
    assert "is no longer stalled: it ended after 31.0 s" in built.summary
    assert "a slow step" in built.summary


def test_ranks_text() -> None:
    assert stall_record.ranks_text([3, 0, 1, 2, 7, 9, 10]) == "0-3,7,9-10"
    assert stall_record.ranks_text([]) == "none"


def _sleeping_here(release: threading.Event) -> None:
    release.wait(30)


def test_a_ranks_answer_holds_its_training_threads_stack_and_passes_the_check() -> None:
    tracker = stall.StepTracker(durations=True)
    release = threading.Event()

    class Handle:  # the fields the tracker and the answer read (a StepHandle has them)
        def __init__(self, step: int) -> None:
            self.key, self.step, self.name = KEY, step, "tf.function train_step"
            self.start_ns = time.time_ns()
            self.end_ns = 0
            self.thread = 0

    def train() -> None:
        for step in range(3):
            handle = Handle(step)
            tracker.begin(handle)
            handle.end_ns = handle.start_ns + 5_000_000
            tracker.end(handle)
        _sleeping_here(release)

    thread = threading.Thread(target=train)
    thread.start()
    try:
        time.sleep(0.2)
        answer = stall.where(tracker, 7, KEY)
    finally:
        release.set()
        thread.join()
    assert messages.decode(messages.encode(answer)) == answer
    assert answer["q"] == 7 and answer["f"] is None and answer["d"][:2] == [KEY, 2]
    names = [frame[0] for frame in answer["s"]]
    assert "_sleeping_here" in names and "train" in names
    assert all(isinstance(frame[2], int) for frame in answer["s"])  # no value, no local
    assert tracker.recent(KEY) == [5_000_000] * 3


def _provider() -> Tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _of(exporter: InMemorySpanExporter, category: str) -> List:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.attributes.get(record.ATTR_CATEGORY) == category
    ]


def _wait(predicate, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def hang_here(release: threading.Event) -> None:
    release.wait(60)


def _three_ranks(job_id: str) -> Tuple[List, List[Pipeline]]:
    """Three in-process ranks over the real coordinator TCP (stall floor 0.3 s): each rank's
    (provider, exporter) and pipeline."""
    port = free_port_pair()
    settings = Settings(coordinator=("127.0.0.1", port), root_wait_ms=500, stall_floor_s=0.3)
    providers = [_provider() for _ in range(3)]
    pipelines = [
        Pipeline(settings, Topology(rank=r, world_size=3, job_id=job_id), providers[r][0])
        for r in range(3)
    ]
    return providers, pipelines


def test_three_ranks_over_tcp_rank0_names_the_stopped_rank_then_closes_the_stall() -> None:
    providers, pipelines = _three_ranks("js")
    release = threading.Event()

    def rank2() -> None:
        for _ in range(4):
            handle = pipelines[2].begin_step(KEY, "tf.function train_step", record.TF_FUNCTION)
            time.sleep(0.01)
            pipelines[2].end_step(handle)
        hang_here(release)  # stops before step 4

    thread = threading.Thread(target=rank2)
    thread.start()
    try:
        for _ in range(4):
            handles = [
                p.begin_step(KEY, "tf.function train_step", record.TF_FUNCTION)
                for p in pipelines[:2]
            ]
            time.sleep(0.01)
            for p, h in zip(pipelines[:2], handles):
                p.end_step(h)
        assert _wait(lambda: pipelines[0].connected_ranks() == {1, 2})
        handles = [
            p.begin_step(KEY, "tf.function train_step", record.TF_FUNCTION) for p in pipelines[:2]
        ]  # step 4: ranks 0 and 1 are in it, rank 2 never comes
        began = time.monotonic()
        assert _wait(lambda: _of(providers[0][1], record.STALL), 15)
        detected = time.monotonic() - began
        stalled = _of(providers[0][1], record.STALL)[0]
        attrs = stalled.attributes
        assert attrs[record.ATTR_STALL_STATE] == record.STALLED
        assert (attrs[record.ATTR_STEP], attrs[record.ATTR_STEP_KEY]) == (4, KEY)
        assert list(attrs[record.ATTR_STALL_MISSING]) == [2]
        assert list(attrs[record.ATTR_STALL_WAITING]) == [0, 1]
        assert list(attrs[record.ATTR_STALL_SILENT]) == []
        assert stalled.context.trace_id == step_trace_id("js", KEY, 4)
        assert stalled.parent.span_id == step_root_span_id("js", KEY, 4)
        stack2 = next(s for s in attrs[record.ATTR_STALL_STACKS] if s.startswith("rank 2 "))
        assert "hang_here (test_stall.py:" in stack2 and "rank2 (test_stall.py:" in stack2
        threshold_s = attrs[record.ATTR_STALL_THRESHOLD] / 1e9
        # the floor, unless a loaded host stretched the ~10 ms steps past 30 ms (10 x median)
        assert threshold_s >= 0.3
        # a tick, the answers' wait at most, and slack for a loaded host
        limit = threshold_s + stall.CHECK_INTERVAL_S + stall.ANSWER_WAIT_S + 2.0
        assert detected < limit, (detected, threshold_s)
        # every rank inside the step exported it, marked in flight, in the step's trace
        for rank in (0, 1):
            assert _wait(
                lambda r=rank: any(
                    s.attributes.get(record.ATTR_STEP_IN_FLIGHT)
                    for s in _of(providers[r][1], record.STEP)
                ),
                5,
            )
            flights = [
                s
                for s in _of(providers[rank][1], record.STEP)
                if s.attributes.get(record.ATTR_STEP_IN_FLIGHT)
            ]
            assert len(flights) == 1 and flights[0].attributes[record.ATTR_STEP] == 4
            assert flights[0].context.trace_id == step_trace_id("js", KEY, 4)
        assert not [
            s
            for s in _of(providers[2][1], record.STEP)
            if s.attributes.get(record.ATTR_STEP_IN_FLIGHT)
        ]
        # the step ends after all (a slow step): one resolved record closes the stall
        release.set()
        thread.join(10)
        handle2 = pipelines[2].begin_step(KEY, "tf.function train_step", record.TF_FUNCTION)
        pipelines[2].end_step(handle2)
        for p, h in zip(pipelines[:2], handles):
            p.end_step(h)
        assert _wait(
            lambda: any(
                s.attributes[record.ATTR_STALL_STATE] == record.RESOLVED
                for s in _of(providers[0][1], record.STALL)
            ),
            5,
        )
        resolved = [
            s
            for s in _of(providers[0][1], record.STALL)
            if s.attributes[record.ATTR_STALL_STATE] == record.RESOLVED
        ]
        assert len(resolved) == 1
        assert resolved[0].attributes[record.ATTR_STALL_DURATION] >= 0.3 * 1e9
        assert resolved[0].context.trace_id == step_trace_id("js", KEY, 4)
    finally:
        release.set()
        thread.join(10)
        for p in reversed(pipelines):
            p.shutdown()


def test_exit_in_the_middle_of_a_step_exports_it_in_flight() -> None:
    provider, exporter = _provider()
    pipeline = Pipeline(Settings(), Topology(job_id="jx"), provider)
    done = pipeline.begin_step(KEY, "tf.function train_step", record.TF_FUNCTION)
    pipeline.end_step(done)
    pipeline.begin_step(KEY, "tf.function train_step", record.TF_FUNCTION)  # never ends
    pipeline.shutdown()
    steps = _of(exporter, record.STEP)
    flights = [s for s in steps if s.attributes.get(record.ATTR_STEP_IN_FLIGHT)]
    assert len(flights) == 1 and flights[0].attributes[record.ATTR_STEP] == 1
    assert flights[0].attributes[record.ATTR_STEP_IN_FLIGHT_REASON] == "exit"
    stack = list(flights[0].attributes[record.ATTR_STEP_STACK])
    assert any(line.startswith("test_exit_in_the_middle_of_a_step") for line in stack), stack
    assert [s.attributes[record.ATTR_STEP] for s in steps if s not in flights] == [0]


def test_stall_off_starts_no_watch() -> None:
    port = free_port_pair()
    settings = Settings(coordinator=("127.0.0.1", port), stall=False)
    pipeline = Pipeline(settings, Topology(rank=0, world_size=2, job_id="jo"), _provider()[0])
    handle = pipeline.begin_step(KEY, "tf.function train_step", record.TF_FUNCTION)
    pipeline.end_step(handle)
    try:
        assert pipeline._stall_watch is None
    finally:
        pipeline.shutdown(timeout_s=0.5)


def _span(span_id: str, category: str, rank: int, start: int, end: int, **extra) -> object:
    from tf_otel.analysis.model import Span

    attributes = {record.ATTR_CATEGORY: category, record.ATTR_RANK: rank, record.ATTR_STEP: 4}
    attributes.update(extra)
    return Span("t1", span_id, "root", f"{category} {rank}", start, end, attributes, {})


def test_the_analysis_skips_stall_spans_and_prefers_a_step_span_that_ended() -> None:
    from tf_otel.analysis.steps import group_steps

    in_flight = {record.ATTR_STEP_IN_FLIGHT: True}
    spans = [
        _span("a0", record.STEP, 0, 100, 150, **in_flight),  # exported mid-step (a stall) ...
        _span("b0", record.STEP, 0, 100, 400),  # ... and the step span once it ended
        _span("a1", record.STEP, 1, 110, 150, **in_flight),  # rank 1 never ended the step
        _span("s0", record.STALL, 0, 100, 150),  # rank 0's stall record: no timeline part
    ]
    steps, _ = group_steps(spans)
    (step,) = steps
    assert step.ranks[0].step_span.span_id == "b0"
    assert (step.ranks[0].start_ns, step.ranks[0].end_ns) == (100, 400)
    assert step.ranks[1].step_span.span_id == "a1"
    assert not step.ranks[0].fillers and not step.ranks[0].nodes


def test_any_answer_decode_accepts_builds_a_record() -> None:
    """What ``decode`` lets through as a rank's answer, rank 0 turns into a record (no raise)."""
    import json

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    anything = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    where_ = st.none() | st.lists(
        st.text(max_size=8) | st.integers(-2, 2**64), min_size=3, max_size=3
    )
    frame = st.lists(st.text(max_size=8) | st.integers(-5, 5), min_size=3, max_size=3)
    bodies = st.fixed_dictionaries(
        {
            "t": st.just(messages.STALL_WHERE),
            "q": st.integers(-1, 3) | anything,
            "f": where_ | anything,
            "d": where_ | anything,
            "n": st.text(max_size=8) | anything,
            "s": st.lists(frame | anything, max_size=4) | anything,
        },
        optional={
            "c": st.lists(
                st.integers(-1, 3) | st.lists(st.lists(st.text(max_size=4), max_size=3)),
                max_size=3,
            )
            | anything,
            "l": st.none() | st.lists(st.text(max_size=4) | st.integers(-1, 3), max_size=3),
        },
    )
    accepted = []

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(bodies, st.sampled_from([KEY, ""]), st.integers(0, 3))
    def check(body: dict, key: str, step: int) -> None:
        try:
            message = messages.decode(json.dumps(body).encode())
        except messages.BadMessage:
            return
        accepted.append(message)
        built = stall_record.build_record(key, step, 2, S, S, 1, {1: message}, {1})
        assert built.summary and built.silent == [0]  # rank 0 gave no answer here
        stall_record.build_record(key, step, 2, S, S, 1, {1: message}, {1}, rank0_in_step=False)

    check()
    assert accepted  # the strategy does reach the record


def test_the_record_says_which_collectives_the_step_holds_and_that_none_completed() -> None:
    held = [2, [["allreduce", "DistributedGradientTape_Allreduce/a"], ["allgather", "g"]]]
    waiting = {**_answer([KEY, 8, 21 * S], [KEY, 7, 21 * S], WAITING_STACK), "c": held}
    eager = ["allreduce", "metric_average", 20 * S]
    hung = {**_answer(None, [KEY, 7, 21 * S], HUNG_STACK, name=""), "c": [0, []], "l": eager}
    for answer in (waiting, hung):  # both pass the wire check
        assert messages.decode(messages.encode(answer)) == answer
    answers = {0: waiting, 1: waiting, 2: hung}
    built = stall_record.build_record(KEY, 8, 3, 21 * S, 20 * S, 1, answers, connected={1, 2})
    attrs = built.attributes
    assert attrs[record.ATTR_STALL_COLLECTIVES] == [
        "allreduce DistributedGradientTape_Allreduce/a",
        "allgather g",
    ]
    assert attrs[record.ATTR_STALL_COLLECTIVE_COUNT] == 2
    assert (
        "The step's graph holds 2 collectives: allreduce DistributedGradientTape_Allreduce/a, "
        "allgather g; none of them can have completed: ranks 2 have not begun it."
    ) in built.summary
    line2 = next(x for x in attrs[record.ATTR_STALL_RANKS] if x.startswith("rank 2:"))
    assert "its last eager collective, allreduce metric_average, returned 20.0 s ago" in line2
    # nobody missing (a rank silent instead): no claim that none completed
    quiet = stall_record.build_record(
        KEY, 8, 3, 21 * S, 20 * S, 1, {0: waiting, 1: waiting}, {1, 2}
    )
    assert "holds 2 collectives" in quiet.summary and "none of them" not in quiet.summary
    # no collective known (eager ones, TF1 graphs): nothing said about collectives
    plain = stall_record.build_record(
        KEY, 8, 3, 21 * S, 20 * S, 1, {0: _answer([KEY, 8, S], None, [])}, {}
    )
    assert (
        record.ATTR_STALL_COLLECTIVES not in plain.attributes and "collectives" not in plain.summary
    )


def test_bad_collectives_in_an_answer_are_named() -> None:
    base = _answer([KEY, 8, S], None, [])
    for field, value in (
        ("c", [-1, []]),
        ("c", [1, [["allreduce"]]]),
        ("c", [1, [["allreduce", "x"]] * (messages.MAX_STALL_COLLECTIVES + 1)]),
        ("l", ["allreduce", "x", -5]),
        ("l", ["allreduce", 3, 5]),
    ):
        body = {**base, field: value}
        try:
            messages.decode(messages.encode(body))
        except messages.BadMessage as e:
            assert f"'{field}'" in str(e) or field in str(e), str(e)
        else:
            raise AssertionError(f"{field}={value!r} passed the check")
    ask = messages.stall_ask(1, KEY, 3, export=False)
    assert messages.decode(messages.encode(ask)) == ask and ask["x"] == 0
    try:
        messages.decode(messages.encode({**ask, "x": 7}))
    except messages.BadMessage as e:
        assert "x" in str(e)
    else:
        raise AssertionError("x=7 passed")


def test_step_collectives_are_learned_per_key_deduplicated_and_bounded() -> None:
    from tf_otel.cluster.step_collectives import MAX_KEYS, MAX_NAMES, StepCollectives

    log = StepCollectives()
    assert log.built(KEY) == (0, []) and log.last_done() is None
    log.note_built(KEY, "allreduce", "grad_0")
    log.note_built(KEY, "allreduce", "grad_1")
    log.note_built(KEY, "allreduce", "grad_0")  # the twin's trace builds it again
    assert log.built(KEY) == (2, [["allreduce", "grad_0"], ["allreduce", "grad_1"]])
    for i in range(MAX_NAMES + 10):
        log.note_built("big", "allreduce", f"g{i}")
    total, shown = log.built("big", shown=MAX_NAMES + 50)
    assert total == MAX_NAMES + 10 and len(shown) == MAX_NAMES  # counted, not all kept
    for i in range(MAX_KEYS + 5):
        log.note_built(f"k{i}", "allgather", "x")
    assert log.built(KEY) == (0, [])  # the oldest keys went
    log.note_done("allreduce", "loss")
    op, name, since = log.last_done()
    assert (op, name) == ("allreduce", "loss") and 0 <= since < 5 * S


def test_rank0_stopped_between_steps_is_named_when_the_others_wait_and_not_when_all_rest() -> None:
    """Rank 0 outside any step: while every rank rests (a control: all between steps past the
    threshold) nothing is raised; once ranks 1, 2 are in step 4 that rank 0 never begins, the
    stall names rank 0 in step 4's trace, and closes when rank 0 goes on."""
    providers, pipelines = _three_ranks("jb")
    release, rested = threading.Event(), threading.Event()

    def rank0() -> None:
        for _ in range(4):
            handle = pipelines[0].begin_step(KEY, "tf.function train_step", record.TF_FUNCTION)
            time.sleep(0.01)
            pipelines[0].end_step(handle)
        rested.wait(30)
        hang_here(release)  # stops before step 4
        handle = pipelines[0].begin_step(KEY, "tf.function train_step", record.TF_FUNCTION)
        pipelines[0].end_step(handle)

    thread = threading.Thread(target=rank0)
    thread.start()
    try:
        for _ in range(4):
            handles = [
                p.begin_step(KEY, "tf.function train_step", record.TF_FUNCTION)
                for p in pipelines[1:]
            ]
            time.sleep(0.01)
            for p, h in zip(pipelines[1:], handles):
                p.end_step(h)
        assert _wait(lambda: pipelines[0].connected_ranks() == {1, 2})
        time.sleep(1.5)  # the control: every rank between steps, 5 thresholds long
        assert not _of(providers[0][1], record.STALL)
        rested.set()
        handles = [
            p.begin_step(KEY, "tf.function train_step", record.TF_FUNCTION) for p in pipelines[1:]
        ]  # step 4: ranks 1 and 2 are in it, rank 0 never begins it
        assert _wait(lambda: _of(providers[0][1], record.STALL), 15)
        stalled = _of(providers[0][1], record.STALL)[0]
        attrs = stalled.attributes
        assert attrs[record.ATTR_STALL_STATE] == record.STALLED
        assert attrs[record.ATTR_STALL_RANK0_BETWEEN] is True
        assert (attrs[record.ATTR_STEP], attrs[record.ATTR_STEP_KEY]) == (4, KEY)
        assert list(attrs[record.ATTR_STALL_MISSING]) == [0]
        assert list(attrs[record.ATTR_STALL_WAITING]) == [1, 2]
        assert stalled.context.trace_id == step_trace_id("jb", KEY, 4)
        stack0 = next(s for s in attrs[record.ATTR_STALL_STACKS] if s.startswith("rank 0 "))
        assert "hang_here (test_stall.py:" in stack0 and "rank0 (test_stall.py:" in stack0
        # the ranks in the step exported it in flight (the report's ask, not the probe's)
        for rank in (1, 2):
            assert _wait(
                lambda r=rank: any(
                    s.attributes.get(record.ATTR_STEP_IN_FLIGHT)
                    for s in _of(providers[r][1], record.STEP)
                ),
                5,
            )
        release.set()
        thread.join(10)
        for p, h in zip(pipelines[1:], handles):
            p.end_step(h)
        assert _wait(
            lambda: any(
                s.attributes[record.ATTR_STALL_STATE] == record.RESOLVED
                for s in _of(providers[0][1], record.STALL)
            ),
            5,
        )
        (resolved,) = [
            s
            for s in _of(providers[0][1], record.STALL)
            if s.attributes[record.ATTR_STALL_STATE] == record.RESOLVED
        ]
        assert resolved.attributes[record.ATTR_STALL_RANK0_BETWEEN] is True
        assert resolved.context.trace_id == step_trace_id("jb", KEY, 4)
    finally:
        release.set()
        rested.set()
        thread.join(10)
        for p in reversed(pipelines):
            p.shutdown()
