"""Rank 0's CPU for its live verdicts (tf_otel/cluster/verdicts.py) per step, by job size.

What rank 0 adds per step root: judging the step (every rank's lateness, the noise model refitted
every few steps, the slowdown detector) and recording every rank's lateness in the histogram.
Measured in-process on synthetic steps of N ranks (the per-rank extents and, on 1 step in 20,
arrivals, as the coordinator hands them over), thread CPU time per step, steady state (after the
64-step window filled), in interleaved rounds of the sizes.

    .venv/bin/python bench/bench_verdicts.py [--rounds 5] [--steps 400] [--ranks 4,64,256,1024]

Writes the table into docs/benchmarks/verdicts.md (--out), between its generated-section markers
(harness.write_generated: the hand-written rest of the file stays).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import harness

REPO = Path(__file__).resolve().parent.parent
TITLE = "Rank 0's live verdicts: CPU per step (bench/bench_verdicts.py)"
sys.path.insert(0, str(REPO))

MS = 1_000_000


def _per_step_us(ranks: int, steps: int, with_metrics: bool, seed: int) -> float:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.trace import SpanContext, TraceFlags

    from tf_otel.cluster.verdicts import LiveVerdicts
    from tf_otel.metrics.step_metrics import StepMetrics

    rng = random.Random(seed)
    verdicts = LiveVerdicts()
    metrics = None
    if with_metrics:
        provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
        metrics = StepMetrics(provider.get_meter("bench"), 0)
    root = SpanContext(0xABC, 0x123, False, TraceFlags(TraceFlags.SAMPLED))
    spent: List[int] = []
    t = 0
    for step in range(steps):
        extents = {}
        arrivals: Dict[int, int] = {}
        for rank in range(ranks):
            start = t + rng.randrange(0, MS)
            extents[rank] = (start, t + 100 * MS, rng.randrange(0, 300_000))
            arrivals[rank] = start + 90 * MS + rng.randrange(0, MS)
        t0 = time.thread_time_ns()
        if step % 20 == 0:
            verdicts.note_arrivals("k", step, arrivals)
        verdict = verdicts.judge("k", step, extents)
        if metrics is not None and verdict is not None and verdict.judged:
            metrics.record_lateness(verdict.by_rank_ns, root, verdict.rank)
        if step >= 64:  # the window has filled: the steady state
            spent.append(time.thread_time_ns() - t0)
        t += 101 * MS
    return statistics.median(spent) / 1000 if spent else 0.0


def write_doc(path: Path, text: str) -> None:
    """``text`` as the generated section of the doc at ``path``; the rest of the file stays."""
    harness.write_generated(path, "bench_verdicts", text, TITLE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--ranks", default="4,64,256,1024")
    parser.add_argument("--out", default=str(harness.RESULTS / "verdicts.md"))
    args = parser.parse_args()
    sizes = [int(r) for r in args.ranks.split(",")]
    modes = [(n, m) for n in sizes for m in (False, True)]
    results = harness.interleaved(
        modes,
        args.rounds,
        lambda round_no, mode: _per_step_us(mode[0], args.steps, mode[1], round_no),
    )
    rows = []
    for n in sizes:
        judge = statistics.median(results[(n, False)])
        both = statistics.median(results[(n, True)])
        rows.append(f"| {n} | {judge:.0f} | {both:.0f} | {both / n:.2f} | {both / 1e3 / 100:.3%} |")
    text = (
        f"""Thread CPU time on rank 0 per step root, median of {args.rounds} interleaved rounds of
{args.steps} synthetic steps (steady state: after the 64-step window), arrivals on 1 step in 20.
"with histogram": plus recording every rank's lateness (`tf_otel.rank.lateness`). The share is
of one core at 100 ms steps.

| ranks | judge, µs/step | with histogram, µs/step | µs per rank-step | of a core at 100 ms steps |
|---|---|---|---|---|
"""
        + "\n".join(rows)
        + "\n"
    )
    print(text)
    write_doc(Path(args.out), text)


if __name__ == "__main__":
    main()
