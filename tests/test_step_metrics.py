"""Step histograms (tf_otel.metrics.step_metrics) on a real SDK MeterProvider: every step counted
once, exemplars only from sampled steps' spans, the collective wait as the union of waits."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    set_span_in_context,
)

from tf_otel import record
from tf_otel.metrics.step_metrics import (
    BOUNDARIES,
    COLLECTIVE_WAIT_DURATION,
    INPUT_WAIT_DURATION,
    LATENESS_POINTS,
    MAX_PENDING,
    RANK_LATENESS,
    STEP_DURATION,
    StepMetrics,
    collective_wait_ns,
)
from tf_otel.step_handle import StepHandle

MS = 1_000_000


@pytest.fixture
def metrics():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield StepMetrics(provider.get_meter("tf_otel"), rank=3), reader
    provider.shutdown()


def _handle(
    step: int, duration_ms: float, kind: str = "keras_train", input_wait_ns: Optional[int] = None
) -> StepHandle:
    start = 1_000 * MS
    handle = StepHandle(kind, step, kind, kind, 0, True, start, start + int(duration_ms * MS))
    handle.input_wait_ns = input_wait_ns
    return handle


def _points(reader) -> Dict[str, List[Any]]:
    out: Dict[str, List[Any]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def _span(trace_id: int, span_id: int, sampled: bool = True) -> SpanContext:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags)


def test_every_step_counted_exemplars_only_from_sampled_steps(metrics):
    m, reader = metrics
    for step in range(10):  # unsampled: buffered on the training thread
        m.add(_handle(step, 3.0))
    assert m.drain() == 10
    m.record_step(_handle(10, 700.0), _span(0xABC, 0x123))  # a slow sampled step
    points = _points(reader)
    (point,) = points[STEP_DURATION]
    assert point.count == 11
    assert point.attributes == {"tf_otel.rank": 3, "tf_otel.step.kind": "keras_train"}
    assert list(point.explicit_bounds) == list(BOUNDARIES)
    assert point.bucket_counts[BOUNDARIES.index(0.005)] == 10  # 3 ms: the (2 ms, 5 ms] bucket
    assert point.sum == pytest.approx(0.73)
    # the one exemplar is the sampled step's, in the 700 ms bucket, pointing at its span
    assert [(e.trace_id, e.span_id, e.value) for e in point.exemplars] == [(0xABC, 0x123, 0.7)]
    assert INPUT_WAIT_DURATION not in points  # no step measured its input wait


def test_unsampled_span_context_gives_no_exemplar(metrics):
    # the SDK's default trace_based filter drops a not-sampled context by itself
    m, reader = metrics
    context = set_span_in_context(NonRecordingSpan(_span(0xDEF, 0x456, sampled=False)))
    m.duration.record(0.01, {"tf_otel.rank": 3}, context=context)
    (point,) = _points(reader)[STEP_DURATION]
    assert point.count == 1 and list(point.exemplars) == []


def test_input_wait_where_measured_and_per_kind_points(metrics):
    m, reader = metrics
    m.add(_handle(0, 10.0, input_wait_ns=4 * MS))
    m.add(_handle(1, 10.0))  # not measured: no input wait point
    m.add(_handle(0, 1.5, kind="tf_function"))
    m.drain()
    m.record_step(_handle(2, 10.0, input_wait_ns=0), _span(7, 8))
    points = _points(reader)
    (wait,) = points[INPUT_WAIT_DURATION]
    assert wait.count == 2 and wait.sum == pytest.approx(0.004)
    assert [(e.trace_id, e.value) for e in wait.exemplars] == [(7, 0.0)]
    kinds = {p.attributes["tf_otel.step.kind"]: p.count for p in points[STEP_DURATION]}
    assert kinds == {"keras_train": 3, "tf_function": 1}


def _collective(start_ms: float, end_ms: float, wait_ms: float, arrival: str = "tick"):
    attrs = {"horovod.wait_ns": int(wait_ms * MS), "horovod.arrival": arrival}
    return record.Record(
        "horovod.allreduce g", int(start_ms * MS), int(end_ms * MS), record.COLLECTIVE, 0, attrs
    )


def test_collective_wait_is_the_union_of_waits():
    # two fused collectives waiting over the same 0-5 ms, a third later: 5 + 2 ms, not 5+4+2
    recs = [_collective(0, 8, 5), _collective(1, 8, 4), _collective(20, 25, 2)]
    recs.append(record.Record("wait", 0, 5 * MS, record.COLLECTIVE_WAIT, 0, {}))
    assert collective_wait_ns(recs) == 7 * MS
    assert collective_wait_ns([_collective(0, 8, 0, arrival="unknown")]) is None
    assert collective_wait_ns([]) is None


def test_collective_wait_recorded_with_the_step_span(metrics):
    m, reader = metrics
    m.record_step(_handle(4, 50.0), _span(0x11, 0x22))
    m.record_collective_wait("keras_train", 4, [_collective(0, 30, 20)], _span(0x11, 0x22))
    m.record_collective_wait("keras_train", 99, [_collective(0, 30, 20)], _span(0x11, 0x23))
    (point,) = _points(reader)[COLLECTIVE_WAIT_DURATION]
    assert point.count == 1 and point.sum == pytest.approx(0.02)  # step 99: never seen, skipped
    assert [(e.trace_id, e.span_id) for e in point.exemplars] == [(0x11, 0x22)]


def test_bounded_buffer_counts_drops(metrics):
    from tf_otel.health import counters

    m, _ = metrics
    before = counters.get("step_metrics_dropped", 0)
    for step in range(MAX_PENDING + 5):
        m.add(_handle(step, 1.0))
    assert len(m.pending) == MAX_PENDING
    assert counters.get("step_metrics_dropped", 0) - before == 5


def test_none_without_a_meter_provider():
    # this test process sets no global MeterProvider (a no-op proxy)
    assert StepMetrics.create(rank=0) is None


def test_eager_next_waits_are_every_steps_input_wait():
    # instrument/data.py: waits on next() before an UNSAMPLED step still give its input wait
    # and stretch its start, as a sampled step's span does
    from tf_otel.instrument import data

    handle = StepHandle("k", 0, "k", "keras_train", 0, False, 100 * MS)
    data.local.pending = [(10 * MS, 14 * MS), (20 * MS, 21 * MS)]
    data.hook.on_step_start(handle, None)
    try:
        assert handle.input_wait_ns == 5 * MS
        assert handle.start_ns == 10 * MS
        assert handle.records == []  # no spans for an unsampled step
    finally:
        data.hook.on_step_end(handle, None, None, None)


def test_always_on_exemplar_filter_still_names_no_unsampled_trace():
    # OTEL_METRICS_EXEMPLAR_FILTER=always_on keeps an exemplar of every step: an unsampled
    # step's carries no trace id (it is recorded with no span), never one of a missing trace
    from opentelemetry.sdk.metrics import AlwaysOnExemplarFilter

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], exemplar_filter=AlwaysOnExemplarFilter())
    try:
        m = StepMetrics(provider.get_meter("tf_otel"), rank=0)
        m.add(_handle(0, 3.0))
        m.drain()
        m.record_step(_handle(1, 300.0), _span(0x77, 0x88))
        (point,) = _points(reader)[STEP_DURATION]
        named = sorted((e.trace_id or 0, e.value) for e in point.exemplars)
        assert named == [(0, 0.003), (0x77, 0.3)]
    finally:
        provider.shutdown()


def test_lateness_every_rank_of_a_small_job_a_window_of_a_big_one(metrics):
    m, reader = metrics
    root = _span(0xF00, 0xBA2)
    m.record_lateness({0: 0, 1: 2 * MS, 2: -MS, 3: 150 * MS}, root, straggler=3)
    points = {p.attributes[record.ATTR_RANK]: p for p in _points(reader)[RANK_LATENESS]}
    assert sorted(points) == [0, 1, 2, 3] and points[2].sum == 0.0  # early: 0, not < 0
    assert points[3].sum == pytest.approx(0.150)
    exemplars = {r: p.exemplars for r, p in points.items()}
    assert [e.trace_id for e in exemplars[3]] == [0xF00], "the straggler's opens its root"
    assert not exemplars[0] and not exemplars[1]
    # 200 ranks: LATENESS_POINTS a step, a moving window; every rank within ceil(200/64) steps
    big = {r: r * 1000 for r in range(200)}
    for _ in range(-(-200 // LATENESS_POINTS)):
        m.record_lateness(big, root, straggler=199)
    counts = {p.attributes[record.ATTR_RANK]: p.count for p in _points(reader)[RANK_LATENESS]}
    assert set(counts) == set(range(200)) and counts[199] >= 4
