"""TF_OTEL_TEST_CLOCK parsing and the shifted now_ns()."""

from __future__ import annotations

import logging
import time

import pytest

from tf_otel import clock, health
from tf_otel.clock import testclock


def test_parse_entries() -> None:
    shift = testclock.parse("0:5:0, 1:-2000000000:200", rank=1, start_ns=1_000)
    assert shift is not None
    assert (shift.skew_ns, shift.start_ns) == (-2_000_000_000, 1_000)
    assert shift.drift == pytest.approx(200e-6)
    assert testclock.parse("0:5:0", rank=1) is None
    assert testclock.parse("", rank=0) is None


def test_error_inverse() -> None:
    shift = testclock.TestClock(skew_ns=2_000_000_000, drift=200e-6, start_ns=10**18)
    true = 10**18 + 5 * 10**9
    local = true + shift.error_at(true)
    assert shift.error_at(true) == 2_000_000_000 + 1_000_000
    assert abs(shift.true_from_local(local) - true) <= 1
    assert abs(shift.error_at_local(local) - shift.error_at(true)) <= 1


@pytest.mark.parametrize("raw", ["1:2s:200", "one:2:3", "1:2", "1:2:3:4", "1:0:2000000"])
def test_bad_value_one_clear_line(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    health._logged.discard("config:TF_OTEL_TEST_CLOCK")
    with caplog.at_level(logging.WARNING, logger="tf_otel"):
        assert testclock.parse(raw, rank=1) is None
        assert testclock.parse(raw, rank=1) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "TF_OTEL_TEST_CLOCK" in lines[0] and repr(raw) in lines[0]


def test_now_ns_shifted_on_the_named_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    monkeypatch.setenv("TF_OTEL_TEST_CLOCK", "1:-3000000000:0")
    clock.reset_test_clock()
    try:
        delta = clock.now_ns() - time.time_ns()
        assert -3_000_100_000 < delta < -2_999_900_000
        monkeypatch.setenv("HOROVOD_RANK", "0")
        clock.reset_test_clock()
        assert abs(clock.now_ns() - time.time_ns()) < 100_000_000
        assert clock.test_clock() is None
    finally:
        monkeypatch.delenv("TF_OTEL_TEST_CLOCK")
        clock.reset_test_clock()


def test_bad_env_value_leaves_clock_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_OTEL_TEST_CLOCK", "garbage")
    clock.reset_test_clock()
    try:
        assert abs(clock.now_ns() - time.time_ns()) < 100_000_000
        assert clock.test_clock() is None
    finally:
        monkeypatch.delenv("TF_OTEL_TEST_CLOCK")
        clock.reset_test_clock()
