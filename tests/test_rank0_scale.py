"""Rank 0 with many ranks (issue 26): 256 simulated ranks (threads in two processes, the
product's own CoordinatorClient and ClockSync over real TCP with the handshake) all connect to
rank 0's coordinator and clock service, and every steady step's root holds every rank.

The load bench behind it, with the CPU figures, is bench/bench_rank0.py
(docs/benchmarks/rank0.md)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import bench_rank0  # noqa: E402


def test_256_ranks_all_connect_and_every_steady_root_is_complete() -> None:
    result = bench_rank0.measure(256, seconds=20)
    assert result["connected"] == 256, result  # rank 0 and 255 clients
    assert result["connected_s"] is not None and result["connected_s"] <= 30, result
    assert result["clock_connected_s"] is not None, result  # every clock client connected
    assert result["steady_steps"] >= 20, result
    assert result["complete_steady"] == result["steady_steps"], result


def test_light_hosts_mode_connects_every_rank_and_completes_the_roots() -> None:
    """bench_rank0 --light-hosts on a few dozen ranks: rank 0's host direct, every other host
    one in-process product HostRelay (HostRelay.serve_local) and one clock leader."""
    result = bench_rank0.measure(40, seconds=8, light=True)
    assert result["connected"] == 40 and result["unconnected"] == [], result
    assert result["connections"] == 7 + 4, result  # rank 0's host's 7 ranks + 4 relays
    assert result["clock_connected_s"] is not None, result  # the 4 host clock leaders
    assert result["steady_steps"] >= 8, result
    assert result["complete_steady"] == result["steady_steps"], result
