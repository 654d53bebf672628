"""A world that changes while the job runs (Horovod Elastic, cluster/world.py): the history of
sizes by step, rank 0's aggregator after a resize, the pipeline's change with its record on the
first root of the new world and on the job span, and the analysis' per-step world. The real
elastic run is tests/reliability/test_elastic.py."""

from __future__ import annotations

import time
from typing import Any, Callable, List, Tuple

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tf_otel import record
from tf_otel.analysis.postmortem import stopped_ranks, world_changes
from tf_otel.cluster.coordinator import LEARN_STEPS, StepAggregator
from tf_otel.cluster.world import WorldHistory
from tf_otel.config import Settings
from tf_otel.job.topology import Topology
from tf_otel.runtime.steps import Pipeline


def _wait_until(done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)
    return done()


def test_history_gives_each_step_the_world_that_ran_it() -> None:
    history = WorldHistory(3)
    assert history.size_of("k", 100) == 3 and not history.changed
    change = history.change(2, {"k": 24, "e": 3}, left=[2], hosts={2: "10.0.0.3"})
    assert [history.size_of("k", s) for s in (0, 23, 24, 90)] == [3, 3, 2, 2]
    assert history.size_of("e", 2) == 3 and history.size_of("e", 3) == 2
    assert history.size_of("new", 0) == 2  # a key begun after the change: the new world
    assert history.first_step_of("k", 24) is change and history.first_step_of("k", 25) is None
    assert change.text("k") == "world 3 -> 2 at step 24: rank 2 on host 10.0.0.3 left"
    again = history.change(3, {"k": 40}, joined=[2])
    assert [history.size_of("k", s) for s in (23, 24, 39, 40)] == [3, 2, 2, 3]
    assert again.text("k") == "world 2 -> 3 at step 40: rank 2 joined"
    assert again.attributes("k")[record.ATTR_WORLD_JOINED] == [2]


def _recording() -> Tuple[List[Tuple[Any, ...]], Callable[..., None]]:
    roots: List[Tuple[Any, ...]] = []
    return roots, lambda *args: roots.append(args)


def test_after_a_shrink_roots_wait_for_the_new_world_only_and_are_whole() -> None:
    """World 3, rank 2 leaves at step 10: the pending step of the old world it never reported
    stays partial; the new world's steps go out at 2 extents, whole, not after the wait."""
    roots, emit_root = _recording()
    aggregator = StepAggregator(3, wait_s=30.0, emit_root=emit_root, first_report_grace_s=0.0)
    try:
        for step in range(LEARN_STEPS + 2):
            for rank in (0, 1, 2):
                aggregator.add(rank, "k", step, 10, 20)
        old = LEARN_STEPS + 2  # rank 2 left before reporting it
        aggregator.add(0, "k", old, 10, 20)
        aggregator.add(1, "k", old, 10, 20)
        assert roots[-1][1] == old - 1, "the old world's step waits for rank 2"
        history = WorldHistory(3)
        history.change(2, {"k": old + 1}, left=[2])
        aggregator.history = history
        aggregator.resize(2, left=[2])
        assert roots[-1][1] == old and roots[-1][4:6] == (2, (0, 1)), "old world: partial"
        aggregator.add(0, "k", old + 1, 10, 20)
        aggregator.add(1, "k", old + 1, 10, 20)
        assert roots[-1][1] == old + 1 and roots[-1][4:6] == (2, None), "new world: whole"
    finally:
        aggregator.close()


def test_control_without_a_resize_the_departed_rank_is_waited_for() -> None:
    roots, emit_root = _recording()
    aggregator = StepAggregator(3, wait_s=0.2, emit_root=emit_root, first_report_grace_s=0.0)
    try:
        for rank in (0, 1):
            aggregator.add(rank, "k", 0, 10, 20)
        assert not roots
        assert _wait_until(lambda: len(roots) == 1, 5.0)
        assert roots[0][4:6] == (2, (0, 1)), "partial: rank 2 of 3 missing"
    finally:
        aggregator.close()


def test_pipeline_change_world_puts_one_record_on_the_first_root_and_the_job_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = Settings(stall=False, verdicts=False, root_wait_ms=30000)
    pipeline = Pipeline(settings, Topology(rank=0, world_size=3, job_id="wc"), provider)
    try:
        aggregator = None
        for step in range(3):
            handle = pipeline.begin_step("k", "n", record.TF_FUNCTION)
            pipeline.end_step(handle)
            aggregator = pipeline.exporter.services.aggregator
            assert aggregator is not None
            for rank in (1, 2):
                aggregator.add(rank, "k", step, handle.start_ns, handle.end_ns)
        assert pipeline.change_world(0, 3) is None, "nothing changed"
        change = pipeline.change_world(0, 2)
        assert change is not None and change.at == {"k": 3} and list(change.left) == [2]
        assert pipeline.topology.world_size == 2 and aggregator is not None
        assert aggregator.world_size == 2
        for _ in range(2):
            handle = pipeline.begin_step("k", "n", record.TF_FUNCTION)
            pipeline.end_step(handle)
            aggregator.add(1, "k", handle.step, handle.start_ns, handle.end_ns)
        roots = lambda: {  # noqa: E731
            s.attributes[record.ATTR_STEP]: s
            for s in exporter.get_finished_spans()
            if s.attributes.get(record.ATTR_CATEGORY) == record.STEP_ROOT
        }
        assert _wait_until(lambda: len(roots()) == 5, 5.0), sorted(roots())
        found = roots()
        sizes = [found[s].attributes[record.ATTR_STEP_WORLD_SIZE] for s in range(5)]
        assert sizes == [3, 3, 3, 2, 2]
        assert not any(found[s].attributes.get("tf_otel.step.partial") for s in range(5))
        events = [(s, e) for s in range(5) for e in found[s].events]
        assert [(s, e.name) for s, e in events] == [(3, record.WORLD_CHANGE)]
        assert events[0][1].attributes["message"] == "world 3 -> 2 at step 3: rank 2 left"
        job = pipeline.exporter.services.job_span
        assert [e.name for e in job.events] == [record.WORLD_CHANGE]
    finally:
        pipeline.shutdown(timeout_s=1.0)


class _Digest:
    def __init__(self, step: int, ranks: Tuple[int, ...], missing: Tuple[int, ...]) -> None:
        self.step, self.series = step, None
        self.ranks, self.missing_ranks = ranks, missing


def test_analysis_a_rank_that_left_the_world_is_not_stopped_and_the_change_is_said() -> None:
    left = [_Digest(s, (0, 1, 2), ()) for s in range(5)] + [
        _Digest(s, (0, 1), ()) for s in range(5, 9)
    ]
    assert stopped_ranks(left) == {}  # type: ignore[arg-type]
    assert world_changes(left) == [  # type: ignore[arg-type]
        "world 3 -> 2 at step 5: each step is judged by the ranks of its own world"
    ]
    # control: the same rank stopped in a world of 3 (the later steps still expect it)
    killed = [_Digest(s, (0, 1, 2), ()) for s in range(5)] + [
        _Digest(s, (0, 1), (2,)) for s in range(5, 9)
    ]
    assert stopped_ranks(killed) == {(None, 2): (4, 8)}  # type: ignore[arg-type]
    assert world_changes(killed) == []  # type: ignore[arg-type]


def test_a_renumbered_process_keeps_its_first_rank() -> None:
    """Horovod renumbers the survivors when a rank other than the last leaves (rank 0 here):
    the process keeps the rank its link to rank 0, its resource and its spans began with, so no
    two processes share one; only the world changes."""
    pipeline = Pipeline(
        Settings(stall=False), Topology(rank=2, world_size=3, job_id="rn"), TracerProvider()
    )
    change = pipeline.change_world(1, 2)
    assert change is not None and (change.before, change.after) == (3, 2)
    assert (pipeline.topology.rank, pipeline.topology.world_size) == (2, 2)
    assert pipeline.change_world(1, 2) is None, "the same world again: no change"


def test_history_names_the_ranks_of_each_world() -> None:
    """A rank other than the last leaves: the new world is its processes' first ranks."""
    history = WorldHistory(3)
    assert history.ranks_of("k", 0) == (0, 1, 2)
    change = history.change(2, {"k": 10}, left=[1])
    assert tuple(change.ranks) == (0, 2)
    assert history.ranks_of("k", 9) == (0, 1, 2) and history.ranks_of("k", 10) == (0, 2)
    history.change(1, {"k": 20}, left=[0, 2])  # the count disagrees: Horovod's 0..n-1
    assert history.ranks_of("k", 20) == (0,)


def test_analysis_expects_the_ranks_a_root_names() -> None:
    from tf_otel.analysis.model import Span
    from tf_otel.analysis.steps import StepTrace, world_ranks_of

    root = Span.__new__(Span)
    root.attributes = {record.ATTR_STEP_WORLD_RANKS: [2, 0]}
    assert world_ranks_of(root) == (0, 2)
    step = StepTrace("t", 5, "j", None, 0, 1, {0: None, 2: None}, 2, [])  # type: ignore[dict-item]
    assert step.missing_ranks == [1], "control: 0..n-1 of a world of 2"
    step.world_ranks = world_ranks_of(root)
    assert step.expected_ranks == [0, 2] and step.missing_ranks == []
    root.attributes = {}
    assert world_ranks_of(root) is None


def test_a_stall_record_asks_about_the_ranks_of_the_steps_world() -> None:
    from tf_otel.cluster.stall_record import build_record

    built = build_record("k", 12, 2, 5, 1, 1, {}, connected=set(), ranks=[0, 2])
    assert built.silent == [0, 2]
    control = build_record("k", 12, 2, 5, 1, 1, {}, connected=set())
    assert control.silent == [0, 1]
