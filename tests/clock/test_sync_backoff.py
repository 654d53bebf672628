"""A failed clock round's retry backs off (issue 26: at 4,096 simulated ranks on a loaded VM
rank 0 answered ~6x the planned pings, rounds that ran past the exchange timeout retried every
few seconds at most). The schedule runs in virtual time: the sync thread's waits advance a
clock of the test's instead of sleeping, so an hour of rounds takes milliseconds and nothing
depends on the VM's load; a fake client answers or fails by that clock. A real clock service
that answers slowly (but answers) is the last test: its rounds finish."""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional

import pytest

from tf_otel import clock
from tf_otel.clock import sync as sync_module
from tf_otel.clock.estimate import Exchange
from tf_otel.clock.sync import ClockSync
from tf_otel.clock.transport import TcpClient, TcpServer

INTERVAL_S = 60.0  # the default TF_OTEL_CLOCK_INTERVAL_S
HOUR_S = 3600.0


class VirtualWake:
    """The sync thread's wake-up event, in virtual time: wait(delay) moves the clock on by
    ``delay`` at once; past ``end`` the sync is asked to stop (its next round is the final)."""

    def __init__(self, sync: ClockSync, end: float) -> None:
        self.sync, self.end, self.now = sync, end, 0.0

    def wait(self, delay: Optional[float] = None) -> bool:
        self.now += delay or 0.0
        if self.now >= self.end:
            self.sync._stopping.set()
        return False

    def clear(self) -> None:
        pass

    def set(self) -> None:
        pass


class VirtualClient:
    """A clock client whose rank 0 answers while ``answers(now)`` is true; else each round
    fails (an exchange past its timeout, as from an overloaded rank 0, or no connection where
    it never answered). Records the virtual time of each round it is asked for."""

    def __init__(self, wake: VirtualWake, answers: Callable[[float], bool]) -> None:
        self.wake, self.answers = wake, answers
        self.tries: List[float] = []  # each round's start
        self.failed: List[float] = []
        self.connected = False
        self.bytes_out = self.bytes_in = 0

    def connect(self, timeout: float) -> None:
        self.connected = True

    def exchange(self, n: int, timeout: float) -> List[Exchange]:
        now = self.wake.now
        if self.wake.sync._stopping.is_set():
            raise OSError("the final round: not counted")
        self.tries.append(now)
        if not self.answers(now):
            self.failed.append(now)
            self.connected = False
            raise OSError("timed out")
        t = clock.now_ns()
        return [
            Exchange(t + i * 100, t + i * 100 + 50, t + i * 100 + 50, t + i * 100 + 100)
            for i in range(n)
        ]

    def close(self) -> None:
        self.connected = False


def _run_virtual(answers: Callable[[float], bool], seconds: float) -> VirtualClient:
    """The sync thread's loop run to its end in this thread, ``seconds`` of virtual time."""
    sync = ClockSync(publish=False)
    sync._interval_s = INTERVAL_S
    wake = VirtualWake(sync, seconds)
    client = VirtualClient(wake, answers)
    sync._wake = wake  # type: ignore[assignment]
    sync._client = client
    sync._start_spread_s = 0.0
    sync._run()
    return client


def _gaps(times: List[float]) -> List[float]:
    return [b - a for a, b in zip(times, times[1:])]


def test_rounds_failing_for_an_hour_back_off_to_the_sync_interval() -> None:
    # rank 0 answered the warm-up, then answers no round for an hour (overloaded)
    failing_from = 30.0
    client = _run_virtual(lambda now: now < failing_from, failing_from + HOUR_S)
    assert client.tries[0] == 0.0 and client.failed and client.failed[0] >= failing_from
    retries = client.failed
    planned = HOUR_S / INTERVAL_S  # the rounds rank 0 would have answered in that hour
    # doubling from 50 ms reaches the interval within 11 retries, then one per 30-60 s
    # (x uniform(0.5, 1)); before: every 2.5-5 s, ~1,000 in the hour
    assert len(retries) <= 2 * planned + 15, len(retries)
    late = _gaps(retries)[12:]
    assert late and min(late) >= 0.5 * INTERVAL_S - 1e-6, min(late)
    assert max(_gaps(retries)) <= INTERVAL_S + 1e-6  # capped: never longer than a round's


def test_the_back_off_starts_again_after_a_success() -> None:
    # fails for 10 minutes, answers for 10, fails again
    def answers(now: float) -> bool:
        return now < 10.0 or 610.0 <= now < 1210.0

    client = _run_virtual(answers, 1800.0)
    second = [t for t in client.failed if t >= 1210.0]
    assert len(second) >= 2
    last_success = max(t for t in client.tries if t < 1210.0 and t not in client.failed)
    # the first retry of the second outage waits 25-50 ms, not what the first outage reached
    assert second[1] - second[0] <= sync_module.BACKOFF_FIRST_S + 1e-6
    assert second[0] - last_success <= INTERVAL_S + 1e-6  # the normal cadence up to it
    answered = [t for t in client.tries if 610.0 <= t < 1210.0 and t not in client.failed]
    assert len(answered) >= 8  # rounds resumed once rank 0 answered again


def test_control_rank0_answering_gets_rounds_at_the_normal_cadence() -> None:
    client = _run_virtual(lambda now: True, HOUR_S)
    assert not client.failed
    # warm-up rounds 10, 20, 40 ... ms apart up to the interval (~13 in the first 82 s),
    # then one per interval: ~72 in the hour
    assert 60 <= len(client.tries) <= 80, len(client.tries)
    steady = _gaps(client.tries)[14:]
    assert steady and all(gap == pytest.approx(INTERVAL_S) for gap in steady)


def test_until_rank0_first_answers_retries_stay_at_most_5_s_apart() -> None:
    # at start-up rank 0 is usually not listening yet (no cost to it): the cap stays 5 s, so
    # the first rounds are not held up once it listens
    client = _run_virtual(lambda now: False, 600.0)
    gaps = _gaps(client.failed)
    assert max(gaps) <= sync_module.BACKOFF_MAX_S + 1e-6
    assert len(client.failed) >= 600.0 / sync_module.BACKOFF_MAX_S


def test_a_round_whose_pongs_come_slowly_finishes(monkeypatch: Any) -> None:
    """Real TCP: each pong 25 ms late, so 64 of them take 1.6 s, past the 1 s exchange timeout:
    the timeout is a pong's, so the round still finishes (no round thrown away and run again)."""
    served = TcpServer._pong

    def slow_pong(self: TcpServer, peer: Any, arg: int, t1: int) -> None:
        time.sleep(0.025)
        served(self, peer, arg, t1)

    monkeypatch.setattr(TcpServer, "_pong", slow_pong)
    server = TcpServer("127.0.0.1", 0)
    server.start()
    sync = ClockSync(publish=False, exchange_timeout_s=1.0, connect_timeout_s=10.0)
    sync._client = TcpClient("127.0.0.1", server.port, rank=1)
    try:
        began = time.monotonic()
        assert sync._round()
        assert time.monotonic() - began >= 1.5  # it did run past one exchange timeout
        assert sync.stats.rounds == 1 and sync.stats.failed_rounds == 0
        assert server.bytes_in // 16 == 64  # each ping once: nothing retried
    finally:
        sync._client.close()
        server.close()
