"""The tracing pipeline in-process (no TensorFlow): roots across ranks over the real coordinator
TCP link, consistent sampling, children inside parents, bounded queues."""

from __future__ import annotations

import time
from typing import List, Tuple

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from ports import free_port_pair

from tf_otel import record
from tf_otel.config import Settings
from tf_otel.health import counters
from tf_otel.job.topology import Topology
from tf_otel.otel.ids import step_trace_id
from tf_otel.runtime.steps import Pipeline


def _provider(sampler=None) -> Tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler) if sampler else TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _by_category(spans, category: str) -> List:
    return [s for s in spans if s.attributes.get(record.ATTR_CATEGORY) == category]


def test_single_rank_steps_have_roots_that_cover_them() -> None:
    provider, exporter = _provider()
    pipeline = Pipeline(Settings(), Topology(job_id="j1"), provider)
    for _ in range(3):
        handle = pipeline.begin_step("keras_train", "keras.train_function", record.KERAS_TRAIN)
        time.sleep(0.002)
        pipeline.end_step(handle)
    pipeline.shutdown()
    spans = exporter.get_finished_spans()
    steps, roots = _by_category(spans, record.STEP), _by_category(spans, record.STEP_ROOT)
    assert [s.attributes[record.ATTR_STEP] for s in steps] == [0, 1, 2]
    assert len(roots) == 3
    for step in steps:
        n = step.attributes[record.ATTR_STEP]
        root = next(r for r in roots if r.attributes[record.ATTR_STEP] == n)
        assert (
            step.context.trace_id == root.context.trace_id == step_trace_id("j1", "keras_train", n)
        )
        assert step.parent.span_id == root.context.span_id
        assert root.parent is None
        assert root.start_time <= step.start_time <= step.end_time <= root.end_time
    job = _by_category(spans, record.JOB)
    assert len(job) == 1 and all(r.links[0].context == job[0].context for r in roots)


def test_two_ranks_share_one_root_per_step_over_tcp() -> None:
    port = free_port_pair()  # the clock service takes port + 1
    settings = Settings(coordinator=("127.0.0.1", port), root_wait_ms=5000)
    providers = [_provider(), _provider()]
    pipelines = [
        Pipeline(settings, Topology(rank=r, world_size=2, job_id="j2"), providers[r][0])
        for r in (0, 1)
    ]
    for _ in range(4):
        handles = [
            p.begin_step("tf_function:step", "tf.function step", record.TF_FUNCTION)
            for p in pipelines
        ]
        time.sleep(0.001)
        pipelines[1].end_step(handles[1])  # rank 1 ends later than rank 0 starts...
        time.sleep(0.003)
        pipelines[0].end_step(handles[0])  # ...and rank 0 ends last
    pipelines[1].shutdown()
    pipelines[0].shutdown()
    rank0 = providers[0][1].get_finished_spans()
    rank1 = providers[1][1].get_finished_spans()
    roots = _by_category(rank0, record.STEP_ROOT)
    assert not _by_category(rank1, record.STEP_ROOT), "only rank 0 emits roots"
    assert sorted(r.attributes[record.ATTR_STEP] for r in roots) == [0, 1, 2, 3]
    for root in roots:
        assert root.attributes[record.ATTR_STEP_RANKS] == 2
        children = [
            s
            for s in _by_category(rank0 + rank1, record.STEP)
            if s.context.trace_id == root.context.trace_id
        ]
        assert sorted(s.attributes[record.ATTR_RANK] for s in children) == [0, 1]
        for child in children:
            assert child.parent.span_id == root.context.span_id
            assert root.start_time <= child.start_time and child.end_time <= root.end_time
        assert root.start_time == min(c.start_time for c in children) - 1000
        assert root.end_time == max(c.end_time for c in children) + 1000


def test_ratio_sampling_is_the_same_decision_on_every_rank() -> None:
    decisions = []
    for rank in (0, 1):
        provider, _ = _provider(TraceIdRatioBased(0.5))
        pipeline = Pipeline(Settings(), Topology(rank=rank, job_id="j3"), provider)
        decisions.append(
            [pipeline.begin_step("k", "n", record.TF_FUNCTION).sampled for _ in range(200)]
        )
        pipeline.shutdown()
    assert decisions[0] == decisions[1]
    assert 60 < sum(decisions[0]) < 140


def test_unsampled_steps_export_nothing() -> None:
    provider, exporter = _provider(TraceIdRatioBased(0.0))
    pipeline = Pipeline(Settings(), Topology(job_id="j4"), provider)
    for _ in range(5):
        pipeline.end_step(pipeline.begin_step("k", "n", record.TF_FUNCTION))
    pipeline.shutdown()
    assert not _by_category(exporter.get_finished_spans(), record.STEP)
    assert not _by_category(exporter.get_finished_spans(), record.STEP_ROOT)


def test_child_records_are_clamped_inside_their_parents() -> None:
    provider, exporter = _provider()
    pipeline = Pipeline(Settings(), Topology(job_id="j5"), provider)
    handle = pipeline.begin_step("k", "n", record.TF_FUNCTION)
    time.sleep(0.002)
    parent = record.Record(
        "allreduce", handle.start_ns - 10**6, handle.start_ns + 10**5, record.COLLECTIVE
    )
    child = record.Record(
        "wait",
        parent.start_ns,
        parent.end_ns + 10**9,
        record.COLLECTIVE_WAIT,
        parent_id=parent.record_id,
    )
    handle.records.extend([child, parent])
    pipeline.end_step(handle)
    pipeline.shutdown()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    step, coll, wait = spans["rank 0 n"], spans["allreduce"], spans["wait"]
    assert coll.parent.span_id == step.context.span_id
    assert wait.parent.span_id == coll.context.span_id
    assert step.start_time <= coll.start_time <= coll.end_time <= step.end_time
    assert coll.start_time <= wait.start_time <= wait.end_time <= coll.end_time
    assert counters["spans_clamped"] >= 2


def test_records_that_come_before_their_step_ends_go_under_it() -> None:
    # rank 0 parses its Horovod timeline and sends a rank its collectives as soon as its own step
    # ended; on a loaded machine that rank can still be in the step (it lost them before)
    provider, exporter = _provider()
    pipeline = Pipeline(Settings(), Topology(job_id="j9"), provider)
    handle = pipeline.begin_step("k", "n", record.TF_FUNCTION)
    early = record.Record("allreduce", handle.start_ns, handle.start_ns + 10**5, record.COLLECTIVE)
    pipeline.add_records("k", handle.step, [early])  # queued, so exported, before the step
    time.sleep(0.002)
    pipeline.end_step(handle)
    pipeline.shutdown()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    step, coll = spans["rank 0 n"], spans["allreduce"]
    assert coll.parent.span_id == step.context.span_id
    assert coll.attributes[record.ATTR_STEP] == handle.step


def test_records_of_a_step_that_never_ends_here_are_counted_lost_at_exit() -> None:
    provider, exporter = _provider()
    pipeline = Pipeline(Settings(), Topology(job_id="j10"), provider)
    handle = pipeline.begin_step("k", "n", record.TF_FUNCTION)
    pipeline.end_step(handle)
    orphaned = counters["records_orphaned"]
    early = record.Record("allreduce", handle.start_ns, handle.start_ns + 10**5, record.COLLECTIVE)
    pipeline.add_records("k", handle.step + 1, [early])  # a step this rank never ran
    pipeline.shutdown()
    assert counters["records_orphaned"] == orphaned + 1
    assert "allreduce" not in {s.name for s in exporter.get_finished_spans()}


def test_full_queue_drops_and_counts_instead_of_blocking() -> None:
    provider, _ = _provider()
    pipeline = Pipeline(Settings(max_queue=16), Topology(job_id="j6"), provider)
    pipeline._start()
    before = counters["steps_dropped"]
    pipeline._queue.put(None)  # stop the export thread so the queue fills up
    pipeline._worker.join(5)
    t0 = time.perf_counter()
    for _ in range(100):
        pipeline.end_step(pipeline.begin_step("k", "n", record.TF_FUNCTION))
    assert time.perf_counter() - t0 < 1.0
    assert counters["steps_dropped"] - before >= 80


def test_coordinator_extension_messages_flow_both_ways() -> None:
    port = free_port_pair()  # the clock service takes port + 1
    settings = Settings(coordinator=("127.0.0.1", port))
    received_by_0, received_by_1 = [], []
    pipelines = [
        Pipeline(settings, Topology(rank=r, world_size=2, job_id="j7"), _provider()[0])
        for r in (0, 1)
    ]
    # each pipeline its own handlers: rank 1's "test.ping" handler must never run
    pipelines[0].handlers.on_reference("test.ping", lambda r, m: received_by_0.append((r, m["x"])))
    pipelines[1].handlers.on_reference("test.ping", lambda r, m: received_by_0.append("wrong"))
    pipelines[1].handlers.on_rank("test.pong", lambda m: received_by_1.append(m["x"]))
    try:
        for p in pipelines:
            p._start()
        pipelines[1].send_to_reference({"t": "test.ping", "x": 41})
        deadline = time.monotonic() + 10
        while not received_by_0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert received_by_0 == [(1, 41)]
        assert pipelines[0].broadcast({"t": "test.pong", "x": 42}) == 1
        assert pipelines[0].send_to_rank(1, {"t": "test.pong", "x": 43})
        while len(received_by_1) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert received_by_1 == [42, 43]
        assert received_by_0 == [(1, 41)]
    finally:
        for p in pipelines:
            p.shutdown()


def test_messages_to_a_rank_that_has_not_connected_yet_are_held() -> None:
    port = free_port_pair()  # the clock service takes port + 1
    settings = Settings(coordinator=("127.0.0.1", port))
    got = []
    rank0 = Pipeline(settings, Topology(rank=0, world_size=2, job_id="j8"), _provider()[0])
    rank1 = Pipeline(settings, Topology(rank=1, world_size=2, job_id="j8"), _provider()[0])
    rank1.handlers.on_rank("test.early", lambda m: got.append(m["x"]))
    try:
        rank0._start()
        assert rank0.send_to_rank(1, {"t": "test.early", "x": 1})  # rank 1 not started yet
        assert not rank0.send_to_rank(5, {"t": "test.early", "x": 2})  # no such rank
        rank1._start()
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
        assert got == [1]
    finally:
        rank1.shutdown()
        rank0.shutdown()


def test_late_extents_never_make_a_second_root_and_silent_ranks_are_learnt() -> None:
    from tf_otel.cluster.coordinator import LEARN_STEPS, StepAggregator

    roots = []
    aggregator = StepAggregator(
        3, wait_s=0.3, emit_root=lambda *args: roots.append(args), first_report_grace_s=0.5
    )
    try:
        for step in range(LEARN_STEPS):  # rank 2 never reports (a TF2 PS worker, say)
            aggregator.add(0, "k", step, 10, 20)
            aggregator.add(1, "k", step, 11, 21)
        deadline = time.monotonic() + 5
        while len(roots) < LEARN_STEPS and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [r[1] for r in roots] == list(range(LEARN_STEPS))
        aggregator.add(2, "k", 0, 12, 22)  # too late: step 0's root is out
        aggregator.add(0, "k", LEARN_STEPS, 10, 20)
        aggregator.add(1, "k", LEARN_STEPS, 11, 21)
        assert roots[-1][1] == LEARN_STEPS, "no timeout needed once the reporters are known"
        assert len([r for r in roots if r[1] == 0]) == 1
    finally:
        aggregator.close()


def test_first_roots_wait_for_a_rank_whose_first_report_is_late() -> None:
    """A rank's first reports wait for its clock to settle: early roots wait for a rank never
    heard from (bounded by the grace), instead of going out partial; a control rank set that
    reports in time is emitted at once."""
    from tf_otel.cluster.coordinator import StepAggregator

    roots = []
    aggregator = StepAggregator(
        2, wait_s=0.2, emit_root=lambda *args: roots.append(args), first_report_grace_s=5.0
    )
    try:
        aggregator.add(0, "k", 0, 10, 20)
        time.sleep(0.8)  # past wait_s: without the grace step 0's root would be out, partial
        assert roots == []
        aggregator.add(1, "k", 0, 12, 30)
        assert [(r[1], r[4]) for r in roots] == [(0, 2)], roots  # whole: both ranks
        aggregator.add(0, "k", 1, 40, 50)  # now every rank has been heard from: the usual wait
        deadline = time.monotonic() + 3
        while len(roots) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [(r[1], r[4]) for r in roots][1:] == [(1, 1)]
    finally:
        aggregator.close()
