"""Clock clients start apart (issue 26: at 4,096 simulated ranks, 511 host leaders warming up
against rank 0 in the same second took ~50 s to all connect): a leader's first round waits a
random share of a window that grows with the job's clients, and failed rounds are retried after
a jittered back-off. No sockets: a fake client records when it is used."""

from __future__ import annotations

import threading
import time
from typing import Any, List

import pytest

from tf_otel import clock
from tf_otel.clock import sync as sync_module
from tf_otel.clock.estimate import Exchange
from tf_otel.clock.sync import ClockSync, start_spread_s


class FakeClient:
    """A clock client that answers at once (or always fails) and records its connects."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.connects: List[float] = []
        self.connected = False
        self.bytes_out = self.bytes_in = 0

    def connect(self, timeout: float) -> None:
        self.connects.append(time.monotonic())
        if self.fail:
            raise OSError("refused")
        self.connected = True

    def exchange(self, n: int, timeout: float) -> List[Exchange]:
        now = clock.now_ns()
        return [
            Exchange(now + i * 100, now + i * 100 + 50, now + i * 100 + 50, now + i * 100 + 100)
            for i in range(n)
        ]

    def close(self) -> None:
        self.connected = False


def _run(sync: ClockSync, client: FakeClient, spread_s: float) -> threading.Thread:
    sync._client = client
    sync._start_spread_s = spread_s
    sync._thread = threading.Thread(target=sync._run, daemon=True)
    sync._thread.start()
    return sync._thread


def test_the_spread_grows_with_the_clients_of_rank0_and_is_capped() -> None:
    assert start_spread_s(4096, 8, True) == 5.0  # 511 host leaders: the cap
    assert start_spread_s(1024, 8, True) == pytest.approx(1.27)  # 127 leaders
    assert start_spread_s(16, 8, True) == pytest.approx(0.01)  # one other host
    assert start_spread_s(8, 8, True) == 0.0  # one host: rank 0's own, nobody connects
    assert start_spread_s(1024, 8, False) == 5.0  # every rank a client
    assert start_spread_s(2, 1, False) == pytest.approx(0.01)


def test_a_leader_waits_its_drawn_start_before_its_first_round(monkeypatch: Any) -> None:
    draws: List[tuple] = []

    def uniform(low: float, high: float) -> float:
        draws.append((low, high))
        return 0.4 if high == 2.0 else low  # the start: 0.4 s of a 2 s window

    monkeypatch.setattr(sync_module.random, "uniform", uniform)
    sync = ClockSync(publish=False)
    client = FakeClient()
    began = time.monotonic()
    thread = _run(sync, client, 2.0)
    assert sync.wait_rounds(1, timeout_s=5.0)
    assert draws[0] == (0.0, 2.0)
    assert client.connects[0] - began >= 0.38  # not at once: after its drawn start
    sync.stop(1.0)
    thread.join(2.0)


def test_stop_during_the_start_wait_returns_at_once(monkeypatch: Any) -> None:
    monkeypatch.setattr(sync_module.random, "uniform", lambda low, high: high)
    sync = ClockSync(publish=False)
    client = FakeClient()
    thread = _run(sync, client, 5.0)
    time.sleep(0.05)
    began = time.monotonic()
    sync.stop(2.0)
    assert not thread.is_alive() and time.monotonic() - began < 1.0
    assert client.connects == []  # it never ran a round: nothing held up the exit


def test_failed_rounds_are_retried_after_a_jittered_back_off(monkeypatch: Any) -> None:
    draws: List[tuple] = []
    real = sync_module.random.uniform

    def uniform(low: float, high: float) -> float:
        draws.append((low, high))
        return real(low, high)

    monkeypatch.setattr(sync_module.random, "uniform", uniform)
    sync = ClockSync(publish=False)
    client = FakeClient(fail=True)
    thread = _run(sync, client, 0.0)
    deadline = time.monotonic() + 5.0
    while len(client.connects) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    sync.stop(1.0)
    thread.join(2.0)
    assert len(client.connects) >= 4
    assert draws.count((0.5, 1.0)) >= 3  # each retry's back-off scaled by a random factor
