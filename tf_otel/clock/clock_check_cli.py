"""``tf-otel clock-check``: run the clock exchange across a launch and print per-rank results.

Usage::

    horovodrun -np 2 -H localhost:2 tf-otel clock-check          # TCP to rank 0
    mpirun -np 2 tf-otel clock-check                             # mpi4py when available
    tf-otel clock-check --rounds 5 --exchanges 64 --json

Rank 0 prints one row per rank: offset (reference - local, at the time of the report), drift,
min / median RTT of the last round, uncertainty and fit residual; with TF_OTEL_TEST_CLOCK set
(test only) also the injected offset and the error against it (assuming rank 0 unshifted).
Exit status 0 unless the exchange could not run (1).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List

from tf_otel import cli_args
from tf_otel.clock.sync import ClockSync
from tf_otel.config import Settings
from tf_otel.job.topology import detect


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "clock-check", help="measure every rank's clock offset against rank 0", description=__doc__
    )
    parser.add_argument(
        "--rounds", type=cli_args.positive_int, default=5, help="rounds per rank (default 5)"
    )
    parser.add_argument(
        "--exchanges", type=cli_args.positive_int, default=64, help="ping-pongs per round"
    )
    parser.add_argument(
        "--interval", type=cli_args.non_negative_float, default=0.1, help="seconds between rounds"
    )
    parser.add_argument(
        "--transport",
        choices=("auto", "tcp", "mpi"),
        default="auto",
        help="default: mpi under an MPI launcher when mpi4py is installed, else tcp",
    )
    parser.add_argument(
        "--timeout", type=cli_args.positive_float, default=60.0, help="give up after (s)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def _init_mpi(transport: str, launcher: str) -> None:
    """Initialise MPI (thread multiple) when asked, or under an MPI launcher with mpi4py."""
    if transport == "tcp" or (transport == "auto" and launcher not in ("openmpi", "pmi", "pmix")):
        return
    try:
        import mpi4py

        mpi4py.rc.thread_level = "multiple"
        from mpi4py import MPI  # noqa: F401 - initialises MPI
    except ImportError:
        if transport == "mpi":
            print("tf-otel clock-check: --transport mpi needs mpi4py", file=sys.stderr)


def _us(ns: float) -> str:
    return f"{ns / 1000.0:.3f}"


def format_table(rows: List[Dict[str, Any]]) -> str:
    test = any("injected_offset_ns" in r for r in rows)
    head = ["rank", "offset_us", "drift_ppm", "rtt_min_us", "rtt_med_us", "uncert_us", "resid_us"]
    head += ["rounds", "transport"] + (["injected_us", "error_us"] if test else [])
    lines = [head]
    for r in sorted(rows, key=lambda r: r["rank"]):
        line = [
            str(r["rank"]),
            _us(r["offset_ns"]),
            f"{r['drift_ppm']:.3f}",
            _us(r["rtt_min_ns"]),
            _us(r["rtt_median_ns"]),
            _us(r["uncertainty_ns"]),
            _us(r["residual_ns"]),
            str(r["rounds"]),
            r["transport"],
        ]
        if test:
            line += [_us(r.get("injected_offset_ns", 0)), _us(r.get("error_ns", 0))]
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines)


def run(args: argparse.Namespace) -> int:
    topo = detect()
    settings = Settings.from_env()
    settings = Settings(**{**settings.__dict__, "clock_interval_s": args.interval})
    if topo.world_size <= 1:
        rows = [_reference_row(0, "none")]
        print(json.dumps(rows) if args.json else format_table(rows))
        return 0
    _init_mpi(args.transport, topo.launcher)
    sync = ClockSync(exchanges=args.exchanges, transport=args.transport, warmup_first_s=0.01)
    if not sync.start(topo, settings):
        print(f"tf-otel clock-check: rank {topo.rank}: clock sync did not start", file=sys.stderr)
        return 1
    if topo.rank == 0:
        reports = sync.server.wait_reports(topo.world_size - 1, timeout=args.timeout)
        sync.stop()
        rows = [_reference_row(0, sync.transport_used)] + list(reports.values())
        print(json.dumps(rows) if args.json else format_table(rows), flush=True)
        missing = sorted(
            set(range(1, topo.world_size)) - {int(r["rank"]) for r in reports.values()}
        )
        if missing:
            print(f"tf-otel clock-check: no result from ranks {missing}", file=sys.stderr)
            return 1
        return 0
    ok = sync.wait_rounds(args.rounds, timeout_s=args.timeout)
    sent = ok and sync.send_report()
    sync.stop(timeout_s=1.0)
    if not sent:
        print(f"tf-otel clock-check: rank {topo.rank}: no result", file=sys.stderr)
        return 1
    return 0


def _reference_row(rank: int, transport: str) -> Dict[str, Any]:
    from tf_otel import clock

    row: Dict[str, Any] = {
        "rank": rank,
        "transport": transport,
        "offset_ns": 0,
        "drift_ppm": 0.0,
        "uncertainty_ns": 0,
        "residual_ns": 0.0,
        "rounds": 0,
        "rtt_min_ns": 0,
        "rtt_median_ns": 0,
    }
    if clock.test_clock() is not None:
        # the injected/error columns of the other ranks assume rank 0's clock is not shifted
        row["injected_offset_ns"] = 0
        row["error_ns"] = 0
    return row
