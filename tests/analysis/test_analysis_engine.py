"""Which engine ``tf-otel analyze`` picks (analysis/engine.py), and what it says without Dask."""

from __future__ import annotations

import sys

import pytest

from tf_otel.analysis.engine import (
    LOCAL_CLUSTER_MIN_BYTES,
    InProcess,
    engine_workers,
    open_engine,
    usable_cpus,
)
from tf_otel.analysis.errors import AnalysisError


def test_small_inputs_stay_in_this_process_unless_workers_are_asked_for() -> None:
    assert engine_workers(0, None, LOCAL_CLUSTER_MIN_BYTES - 1) == 1
    assert engine_workers(1, None, 10 * LOCAL_CLUSTER_MIN_BYTES) == 1
    assert engine_workers(3, None, 0) == 3  # asked for: whatever the size
    big = engine_workers(0, None, LOCAL_CLUSTER_MIN_BYTES)
    assert big == (usable_cpus() if usable_cpus() > 1 else 1)
    assert engine_workers(0, "tcp://127.0.0.1:1", 0) >= 1  # a cluster: never this process


def test_without_dask_it_says_so_once_and_runs_here(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # import fails
    with open_engine(2) as chosen:
        assert isinstance(chosen, InProcess)
        assert list(chosen.map(abs, [-1, -2])) == [1, 2]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dask is not installed" in err


def test_a_scheduler_without_dask_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "dask.distributed", None)
    with pytest.raises(AnalysisError, match=r"--scheduler tcp://10\.0\.0\.1:8786: dask is not"):
        open_engine(0, "tcp://10.0.0.1:8786")
