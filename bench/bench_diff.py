"""Benchmark: `tf-otel diff` of two large synthetic jobs holds no more memory than one analysis.

Usage::

    .venv/bin/python bench/bench_diff.py --ranks 64 --steps 400 --keep /tmp/bench_diff

Generates two jobs with bench_analysis.py's generator (one OTLP-JSON file per rank): the
baseline as that bench makes it (rank 3 10 ms late every 10th step), the candidate with rank 5
30 ms late every 10th step instead. Runs, one after the other, `tf-otel analyze BASELINE
--format json` and `tf-otel diff BASELINE CANDIDATE --format json` as child processes and
reports each one's peak RSS (``wait4``), their ratio, wall and CPU seconds, and what the diff
named. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_analysis  # noqa: E402

TF_OTEL = str(Path(sys.executable).with_name("tf-otel"))


def _generate(directory: Path, steps: int, ranks: int, slow_rank: int, delay_ns: int) -> None:
    if directory.exists() and any(directory.iterdir()):
        return
    directory.mkdir(parents=True, exist_ok=True)
    saved = bench_analysis.SLOW_RANK, bench_analysis.DELAY_NS
    bench_analysis.SLOW_RANK, bench_analysis.DELAY_NS = slow_rank, delay_ns
    try:
        bench_analysis.generate(directory, steps, ranks)
    finally:
        bench_analysis.SLOW_RANK, bench_analysis.DELAY_NS = saved


def _measured(command: list) -> dict:
    """Run ``command``; its stdout, wall seconds, CPU seconds and peak RSS (MB)."""
    start = time.perf_counter()
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as child:
        out = child.stdout.read() if child.stdout else ""
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{command[:3]} failed: exit {child.returncode}")
    return {
        "stdout": out,
        "wall_s": round(time.perf_counter() - start, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--keep", default="/tmp/bench_diff", help="generate into (or reuse)")
    args = parser.parse_args()
    root = Path(args.keep) / f"{args.ranks}x{args.steps}"
    baseline, candidate = root / "baseline", root / "candidate"
    _generate(baseline, args.steps, args.ranks, bench_analysis.SLOW_RANK, bench_analysis.DELAY_NS)
    _generate(candidate, args.steps, args.ranks, 5, 30_000_000)
    env_workers = os.environ.get("TF_OTEL_ANALYZE_WORKERS", "1")
    os.environ["TF_OTEL_ANALYZE_WORKERS"] = env_workers  # one process: its RSS is the figure
    analysis = _measured([TF_OTEL, "analyze", str(baseline), "--format", "json"])
    diff = _measured([TF_OTEL, "diff", str(baseline), str(candidate), "--format", "json"])
    report = json.loads(diff["stdout"])
    print(
        json.dumps(
            {
                "ranks": args.ranks,
                "steps": args.steps,
                "analyze_peak_rss_mb": analysis["peak_rss_mb"],
                "diff_peak_rss_mb": diff["peak_rss_mb"],
                "diff_over_analyze": round(diff["peak_rss_mb"] / analysis["peak_rss_mb"], 3),
                "analyze_wall_s": analysis["wall_s"],
                "diff_wall_s": diff["wall_s"],
                "analyze_cpu_s": analysis["cpu_s"],
                "diff_cpu_s": diff["cpu_s"],
                "verdict": report["verdict"]["change"],
                "moved": report["moved"],
                "ranks_moved": [r["label"] for r in report["by_rank"]["ranks"] if r["moved"]],
                "load_average_1m": round(os.getloadavg()[0], 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
