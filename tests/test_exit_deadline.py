"""A rank's exit within TF_OTEL_EXIT_TIMEOUT_S in all: the shutdown's stages share one deadline
(pipeline/exit_deadline.py) instead of each taking up to its own limit one after another."""

from __future__ import annotations

import time

from conftest import free_ports

from tf_otel.pipeline.coordinator import StepAggregator
from tf_otel.pipeline.coordinator_client import CoordinatorClient
from tf_otel.pipeline.exit_deadline import Deadline
from tf_otel.pipeline.services import Services


def test_deadline_counts_down_to_zero_and_caps() -> None:
    deadline = Deadline(0.2)
    assert 0.15 < deadline.left() <= 0.2
    assert deadline.left(0.05) == 0.05
    time.sleep(0.25)
    assert deadline.left() == 0.0
    assert deadline.left(1.0) == 0.0
    assert Deadline(-1.0).left() == 0.0  # a negative timeout is none


def _stalled_services(root_wait_s: float) -> Services:
    """Two stages that each need all the time they are given, as at a real exit: a link to a
    rank 0 that is gone (its client is still trying to connect: it may yet deliver what is
    queued), and rank 0's last step, whose root still waits for a rank that never reports."""
    dead = ("127.0.0.1", free_ports()[0])  # nothing listens there
    client = CoordinatorClient(dead, 1)
    client.report("k", 0, 10, 20)
    aggregator = StepAggregator(3, root_wait_s, lambda *args: None, first_report_grace_s=0.0)
    aggregator.add(0, "k", 0, 10, 20)  # ranks 1 and 2 never report
    return Services(aggregator=aggregator, client=client)


def test_services_stop_within_the_time_given_in_all() -> None:
    services = _stalled_services(root_wait_s=5.0)
    started = time.monotonic()
    services.stop(timeout_s=1.5, root_wait_s=5.0)
    took = time.monotonic() - started
    # each stage alone may take 1.5 s (the link's cap is 2 s, the root's wait 5 s): one after
    # the other they took 3 s before they shared the deadline
    assert 1.0 <= took < 2.0, took


def test_stages_after_a_spent_deadline_take_no_time() -> None:
    services = _stalled_services(root_wait_s=5.0)
    started = time.monotonic()
    services.stop(timeout_s=0.0, root_wait_s=5.0)
    assert time.monotonic() - started < 0.5
