"""`make bench`: run every benchmark in turn (each writes its docs/benchmarks/<area>.md table).

    .venv/bin/python bench/run_all.py [--only steps,clock]

Takes tens of minutes on 2 cores (the analysis bench generates ~1 GB of OTLP-JSON in a temporary
directory). Numbers from a busy machine are noisy: see docs/BENCHMARKS.md for how to read them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SCRIPTS = {
    "steps": ["bench_steps_inprocess.py"],
    "steps-process": ["bench_steps.py"],
    "collectives": ["bench_collectives.py"],
    "real-model": ["bench_real_model.py"],
    "startup": ["bench_startup.py", "--doc"],
    "detail-prep": ["bench_detail_prep.py"],
    "arrivals": ["bench_arrivals.py"],
    "ops": ["bench_ops.py"],
    "clock": ["bench_clock.py"],
    "analysis": ["bench_analysis.py"],
    "rank0": ["bench_rank0.py", "--out", str(BENCH.parent / "docs" / "benchmarks" / "rank0.md")],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma list of: " + ", ".join(SCRIPTS))
    args = parser.parse_args()
    chosen = [name for name in args.only.split(",") if name] or list(SCRIPTS)
    unknown = [name for name in chosen if name not in SCRIPTS]
    if unknown:
        print(f"run_all: unknown benchmark(s) {unknown}; choose from {list(SCRIPTS)}")
        return 2
    failed = []
    for name in chosen:
        script, *extra = SCRIPTS[name]
        started = time.monotonic()
        print(f"== {name}: bench/{script}", flush=True)
        if subprocess.run([sys.executable, str(BENCH / script), *extra]).returncode != 0:
            failed.append(name)
        print(f"== {name}: {time.monotonic() - started:.0f} s", flush=True)
    if failed:
        print(f"run_all: failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
