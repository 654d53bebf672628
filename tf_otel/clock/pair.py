"""A two-process accuracy probe over real TCP (used by tests/clock and bench/bench_clock.py).

Run one process per rank with the usual launcher variables (or HOROVOD_RANK/HOROVOD_SIZE set by
hand) and TF_OTEL_COORDINATOR=127.0.0.1:PORT. Rank 1 runs the real background sync and, from its
main thread, compares the published model against the TF_OTEL_TEST_CLOCK truth every few ms;
rank 0 serves until rank 1 reports. Each prints one JSON line.

Usage::

    python -m tf_otel.clock.pair --duration 3 --exchanges 64 --interval 0.5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import List, Optional

from tf_otel import clock
from tf_otel.clock.sync import SETTLED_ROUNDS, ClockSync
from tf_otel.config import Settings
from tf_otel.job.topology import detect


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--exchanges", type=int, default=64)
    parser.add_argument("--interval", type=float, default=0.5, help="clock_interval_s")
    parser.add_argument("--every", type=float, default=0.005, help="error probe period (s)")
    parser.add_argument(
        "--min-probes",
        type=int,
        default=0,
        help="probe past --duration until this many (a loaded box stretches every sleep)",
    )
    parser.add_argument("--transport", default="tcp")
    args = parser.parse_args(argv)
    topo = detect()
    if args.transport == "mpi":
        import mpi4py

        mpi4py.rc.thread_level = "multiple"
        from mpi4py import MPI  # noqa: F401 - initialises MPI
    settings = Settings.from_env()
    settings = Settings(**{**settings.__dict__, "clock_interval_s": args.interval})
    sync = ClockSync(exchanges=args.exchanges, transport=args.transport)
    if not sync.start(topo, settings):
        print(json.dumps({"rank": topo.rank, "error": "sync did not start"}))
        return 1
    if topo.rank == 0:
        reports = sync.server.wait_reports(topo.world_size - 1, timeout=args.duration + 30)
        if args.transport == "mpi":
            time.sleep(0.2)  # let rank 1's final round finish before MPI finalises
        sync.stop()
        print(json.dumps({"rank": 0, "reports": reports}))
        return 0 if len(reports) == topo.world_size - 1 else 1
    # the settled model, as the exporter uses it (it holds reports until SETTLED_ROUNDS): after
    # one round the drift is not known yet, and 200 ppm alone is 100 us by the next round
    if not sync.wait_rounds(SETTLED_ROUNDS, timeout_s=20):
        print(json.dumps({"rank": topo.rank, "error": "no round"}))
        return 1
    shift = clock.test_clock()
    errors: List[int] = []
    bounds: List[int] = []  # the uncertainty the model in force claimed at each probe
    end = time.monotonic() + args.duration
    while time.monotonic() < end or len(errors) < args.min_probes:
        local = clock.now_ns()
        model = clock.current_model()
        truth = -shift.error_at_local(local) if shift is not None else 0
        errors.append(model.offset_at(local) - truth)
        bounds.append(model.uncertainty_ns)
        time.sleep(args.every)
    sync.resync_now(wait_s=2.0)
    report = sync.report()
    report["errors_ns"] = errors
    report["bounds_ns"] = bounds
    report["every_s"] = args.every
    report["rtt_min_ns"] = sync.stats.last_round.rtt_min_ns if sync.stats.last_round else 0
    sync.send_report()
    sync.stop()
    report["final_error_ns"] = report.get("error_ns")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
