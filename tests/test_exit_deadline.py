"""A rank's exit within TF_OTEL_EXIT_TIMEOUT_S in all: the shutdown's stages share one deadline
(cluster/exit_deadline.py) instead of each taking up to its own limit one after another, and
the spans' flush comes before the stages that only wait (the link to rank 0, clock, metrics)."""

from __future__ import annotations

import time
from typing import Iterator, List, Tuple

import pytest
from opentelemetry.sdk.trace import TracerProvider
from ports import refused_port

from tf_otel import record
from tf_otel.cluster.coordinator import StepAggregator
from tf_otel.cluster.coordinator_client import CoordinatorClient
from tf_otel.cluster.exit_deadline import Deadline
from tf_otel.cluster.services import Services
from tf_otel.config import Settings
from tf_otel.job.topology import Topology
from tf_otel.runtime.steps import Pipeline


def test_deadline_counts_down_to_zero_and_caps() -> None:
    deadline = Deadline(0.2)
    assert 0.15 < deadline.left() <= 0.2
    assert deadline.left(0.05) == 0.05
    time.sleep(0.25)
    assert deadline.left() == 0.0
    assert deadline.left(1.0) == 0.0
    assert Deadline(-1.0).left() == 0.0  # a negative timeout is none


@pytest.fixture
def gone_rank0() -> Iterator[Tuple[str, int]]:
    with refused_port() as port:  # nothing listens there, nor can while the test runs
        yield ("127.0.0.1", port)


def test_a_link_to_a_gone_rank0_stops_within_the_time_given(gone_rank0) -> None:
    # the client is still trying to connect (it may yet deliver what is queued): it takes all
    # the time it is given, 2 s at most, and no more than what is left
    client = CoordinatorClient(gone_rank0, 1)
    client.report("k", 0, 10, 20)
    started = time.monotonic()
    Services(client=client).stop(timeout_s=0.8)
    assert 0.6 <= time.monotonic() - started < 1.3
    client = CoordinatorClient(gone_rank0, 1)
    started = time.monotonic()
    Services(client=client).stop(timeout_s=0.0)
    assert time.monotonic() - started < 0.5


def test_rank0_last_roots_wait_no_longer_than_the_time_given() -> None:
    aggregator = StepAggregator(3, 5.0, lambda *args: None, first_report_grace_s=0.0)
    aggregator.add(0, "k", 0, 10, 20)  # ranks 1 and 2 never report: the root waits
    started = time.monotonic()
    Services(aggregator=aggregator).finish(timeout_s=0.8, root_wait_s=5.0)
    assert 0.6 <= time.monotonic() - started < 1.3


def test_the_span_flush_comes_before_the_link_and_all_ends_within_the_timeout(
    gone_rank0,
) -> None:
    """Rank 1 of a job whose rank 0 has gone: its link is still trying to connect at exit.
    The flush gets (nearly) all the time; the link what is left; the whole shutdown the time
    given. Each with its own limit one after another, the link's 2 s came first and the flush
    then had its own 1.5 s: 3.5 s in all."""
    settings = Settings(coordinator=gone_rank0, host_relay=False)
    topology = Topology(rank=1, world_size=2, job_id="exit-deadline", reference_host=None)
    pipeline = Pipeline(settings, topology, TracerProvider())
    handle = pipeline.begin_step("k", "n", record.TF_FUNCTION)
    pipeline.end_step(handle)
    given: List[float] = []
    started = time.monotonic()

    def flush(left_s: float) -> None:
        given.append(left_s)
        time.sleep(left_s / 2)  # a slow collector: half of what it is given

    pipeline.shutdown(1.5, flush)
    took = time.monotonic() - started
    assert len(given) == 1 and given[0] >= 1.2, given  # before the link's wait, not after
    assert 1.2 <= took < 2.0, took  # the link took the rest, no more


def test_exit_work_that_raises_is_counted_not_printed(capfd) -> None:
    """An SDK shutdown left no time raises ("deadline already exceeded") on run_bounded's
    thread: counted, never a thread traceback on stderr (the job's log)."""
    from tf_otel.health import counters, run_bounded

    def shutdown(timeout_millis: float) -> None:
        raise Exception("Didn't get to execute, deadline already exceeded")

    before = counters["exit_work_failed"]
    assert run_bounded("tf_otel-test-stop", 1.0, shutdown, timeout_millis=0)
    assert counters["exit_work_failed"] == before + 1
    assert "Traceback" not in capfd.readouterr().err
