"""Rank 0's step roots (issue 26): rank 0 never waits for its own clock, one root per step even
when an extent arrives while the step's root is being emitted, partial judged against the job;
another rank's clock reads settled from its rounds, before its export thread has looked."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Callable, List, Tuple

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ports import free_port_pair

from tf_otel import record
from tf_otel.clock.sync import SETTLE_MAX_S, SETTLED_ROUNDS
from tf_otel.cluster import messages
from tf_otel.cluster.coordinator import LEARN_STEPS, StepAggregator
from tf_otel.config import Settings
from tf_otel.health import counters
from tf_otel.job.topology import Topology
from tf_otel.runtime.steps import Pipeline
from tf_otel.step_handle import StepHandle


def _wait_until(done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)
    return done()


def test_rank0_exports_its_first_steps_without_waiting_for_its_own_clock() -> None:
    """Rank 0 is the clock reference and runs no clock rounds: its first steps go out (and reach
    its aggregator) at the next batch, not after the settling bound."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = Settings(coordinator=("127.0.0.1", free_port_pair()))  # clock service: port + 1
    pipeline = Pipeline(settings, Topology(rank=0, world_size=2, job_id="r0c"), provider)
    unsettled = counters["clock_unsettled"]
    try:
        pipeline.end_step(pipeline.begin_step("k", "n", record.TF_FUNCTION))
        assert pipeline.exporter.services.clock_sync is not None, "rank 0 serves the clock"
        steps = lambda: [  # noqa: E731
            s
            for s in exporter.get_finished_spans()
            if s.attributes.get(record.ATTR_CATEGORY) == record.STEP
        ]
        # a third of the settling bound: the export batch interval is 0.5 s
        assert _wait_until(lambda: len(steps()) == 1, SETTLE_MAX_S / 3)
        assert counters["clock_unsettled"] == unsettled
    finally:
        pipeline.shutdown(timeout_s=1.0)


def test_other_ranks_still_wait_for_their_clock_to_settle() -> None:
    pipeline = Pipeline(Settings(), Topology(rank=1, world_size=2, job_id="r1c"), TracerProvider())
    assert not pipeline.exporter.clock_settled


def test_the_clock_reads_settled_from_its_rounds_before_the_export_thread_looks() -> None:
    """``clock_settled`` flips when the export thread takes a step: the first one's batch comes
    at that step's end, after a tf.function's tracing (7 s on a loaded 2-core machine, the
    rounds long settled). A rank's hvd.b (its detail-step start, for rank 0's reading of
    Horovod's response-cache hits) is sent once the rounds settled, not only once that flag
    did: a short job lost every step's start to the flag (tests/horovod, rank1_late)."""
    from tf_otel.instrument.horovod.timeline import TimelineHook

    pipeline = Pipeline(Settings(), Topology(rank=1, world_size=2, job_id="r1s"), TracerProvider())
    exporter = pipeline.exporter
    assert not exporter.clock_settled_now()  # no clock sync (yet): not settled
    sync = SimpleNamespace(stats=SimpleNamespace(rounds=SETTLED_ROUNDS - 1))
    exporter.services.clock_sync = sync
    sent: List[Any] = []
    fake = SimpleNamespace(exporter=exporter, send_to_reference=sent.append)
    handle = StepHandle("k", 4, "train_step", record.TF_FUNCTION, 1, True, 1_000_000)
    assert not exporter.clock_settled_now()
    TimelineHook()._send_began(fake, handle)  # type: ignore[arg-type]
    assert sent == []  # too few rounds: no evidence rather than a wrong one
    sync.stats.rounds = SETTLED_ROUNDS
    assert exporter.clock_settled_now() and not exporter.clock_settled
    TimelineHook()._send_began(fake, handle)  # type: ignore[arg-type]
    assert [(m["t"], m["k"], m["s"]) for m in sent] == [(messages.HVD_BEGAN, "k", 4)]


def _recording() -> Tuple[List[Tuple[Any, ...]], Callable[..., None]]:
    roots: List[Tuple[Any, ...]] = []
    return roots, lambda *args: roots.append(args)


def test_an_extent_arriving_while_a_root_is_emitted_never_starts_a_second_root() -> None:
    """The reaper takes step 0 out of pending (rank 2 late); rank 2's extent arrives just then,
    before the root is out: it is late, not the first extent of a second root."""
    roots, emit_root = _recording()
    aggregator = StepAggregator(3, wait_s=0.1, emit_root=emit_root, first_report_grace_s=0.0)
    emit = aggregator._emit
    injected = []

    def between(key_step: Tuple[str, int], entry: Any) -> None:
        if not injected:  # the extent comes in after pending lost the step, before the root
            injected.append(key_step)
            aggregator.add(2, key_step[0], key_step[1], 12, 22)
        emit(key_step, entry)

    aggregator._emit = between  # type: ignore[method-assign]
    late = counters["roots_late_extent"]
    try:
        aggregator.add(0, "k", 0, 10, 20)
        aggregator.add(1, "k", 0, 11, 21)
        assert _wait_until(lambda: bool(roots), 5.0)
        aggregator.flush(0.0)  # whatever is pending now would be a second root
        assert injected == [("k", 0)]
        assert [r[1] for r in roots] == [0], roots
        assert roots[0][5] == (0, 1)  # partial: rank 2 was late
        assert counters["roots_late_extent"] == late + 1
    finally:
        aggregator.close()


def test_one_root_per_step_with_extents_from_many_threads() -> None:
    """Every rank reports from its own thread while the reaper times steps out: one root each."""
    import threading

    roots, emit_root = _recording()
    world, steps = 8, 60
    aggregator = StepAggregator(world, wait_s=0.0, emit_root=emit_root, first_report_grace_s=0.0)

    def rank(r: int) -> None:
        for step in range(steps):
            aggregator.add(r, "k", step, 10 + step, 20 + step)
            if r == world - 1 and step % 3 == 0:
                time.sleep(0.05)  # the last rank lags: some of its steps are timed out

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        aggregator.flush(0.0)
        emitted = sorted(r[1] for r in roots)
        assert emitted == list(range(steps)), emitted
    finally:
        aggregator.close()


def test_roots_of_fewer_ranks_than_the_job_stay_partial_after_the_first_roots() -> None:
    """World size 4, rank 3 never heard from: its absence stops delaying roots once the first
    roots are out (they go out at once), but every root without it is still partial."""
    roots, emit_root = _recording()
    aggregator = StepAggregator(4, wait_s=0.1, emit_root=emit_root, first_report_grace_s=0.0)
    try:
        for step in range(LEARN_STEPS):
            for r in (0, 1, 2):
                aggregator.add(r, "k", step, 10, 20)
        assert _wait_until(lambda: len(roots) == LEARN_STEPS, 5.0)
        assert all(r[4:6] == (3, (0, 1, 2)) for r in roots), roots
        for r in (0, 1, 2):
            aggregator.add(r, "k", LEARN_STEPS, 10, 20)
        assert roots[-1][1] == LEARN_STEPS, "not waited for: rank 3 was never heard from"
        assert roots[-1][4:6] == (3, (0, 1, 2)), "3 of 4 ranks: partial"
        for r in (3, 0, 1, 2):  # rank 3 heard from at last: the next root waits for it again
            aggregator.add(r, "k", LEARN_STEPS + 1, 10, 20)
        assert roots[-1][1:2] + roots[-1][4:6] == (LEARN_STEPS + 1, 4, None), "whole: not partial"
    finally:
        aggregator.close()


def test_ranks_whose_extents_all_come_late_are_waited_for_from_then_on() -> None:
    """World size 4, ranks 2 and 3 connect late (4,096 simulated ranks: a quarter of them after
    the first roots): the roots learnt 2 reporters and go out at 2 extents, so every extent of
    ranks 2 and 3 comes after its root. After LEARN_STEPS late extents a rank counts as a
    reporter: the next root waits for it and holds all 4 ranks (before: partial for ever)."""
    roots, emit_root = _recording()
    aggregator = StepAggregator(4, wait_s=5.0, emit_root=emit_root, first_report_grace_s=0.0)
    try:
        for step in range(LEARN_STEPS):  # ranks 2 and 3 not there yet: roots timed out
            aggregator.add(0, "k", step, 10, 20)
            aggregator.add(1, "k", step, 10, 20)
        aggregator.wait_s = 0.1
        assert _wait_until(lambda: len(roots) == LEARN_STEPS, 5.0)
        aggregator.wait_s = 5.0
        for step in range(LEARN_STEPS, 2 * LEARN_STEPS):
            for r in (0, 1, 2, 3):  # 2 and 3 after the root went out at 2 extents: late
                aggregator.add(r, "k", step, 10, 20)
            assert roots[-1][1] == step and roots[-1][4:6] == (2, (0, 1))
        step = 2 * LEARN_STEPS
        for r in (0, 1, 2, 3):  # the next root waits for them
            aggregator.add(r, "k", step, 10, 20)
        assert roots[-1][1:2] + roots[-1][4:6] == (step, 4, None), roots[-1]
    finally:
        aggregator.close()


def test_after_complete_first_roots_a_timed_out_root_is_partial() -> None:
    """World size 4, the first roots complete; a later root timed out with 3 ranks is partial."""
    roots, emit_root = _recording()
    aggregator = StepAggregator(4, wait_s=0.1, emit_root=emit_root, first_report_grace_s=0.0)
    try:
        for step in range(LEARN_STEPS):
            for r in range(4):
                aggregator.add(r, "k", step, 10, 20)
        assert [r[4:6] for r in roots] == [(4, None)] * LEARN_STEPS
        for r in (0, 1, 2):
            aggregator.add(r, "k", LEARN_STEPS, 10, 20)
        assert _wait_until(lambda: len(roots) == LEARN_STEPS + 1, 5.0)
        assert roots[-1][1] == LEARN_STEPS and roots[-1][4:6] == (3, (0, 1, 2))
    finally:
        aggregator.close()
