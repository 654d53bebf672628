"""Cost of exact per-rank arrivals (the default collective source) per sampled step, N ranks,
side by side with arrivals off, in one horovodrun job (same processes, same warm graph, same
machine load), modes switched every BLOCK steps on every rank, order rotated each round:

  untraced   step not sampled
  steps      step sampled, no collective detail (arrivals off)
  arrivals   step sampled, collective detail: stamps read, sent to rank 0, last arrivals
             broadcast, collective / wait / transfer spans written (TF_OTEL_FILE)

Horovod's response cache stays on (its default). The graph carries the stamp ops in every mode
(they are built once); their standing cost is in docs/benchmarks/real_model.md.

    .venv/bin/python bench/bench_arrivals.py [--np 4] [--rounds 6] [--block 10] [--layers 24]
Prints a markdown table and writes it into docs/benchmarks/arrivals.md, between the file's
generated-section markers (harness.write_generated: the hand-written rest of the file stays).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import harness

MODES = ("untraced", "steps", "arrivals")
TITLE = "Exact per-rank arrivals: cost per sampled step"


def write_doc(path: Path, text: str) -> None:
    """``text`` as the generated section of the doc at ``path``; the rest of the file stays."""
    harness.write_generated(path, "bench_arrivals", text, TITLE)


def worker(rounds: int, block: int, layers: int) -> None:
    import tf_otel

    tf_otel.instrument()
    import horovod.tensorflow as hvd
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    from tf_otel.instrument.horovod.stamps import collector
    from tf_otel.otel import ids
    from tf_otel.runtime import lifecycle

    hvd.init()
    train_step = harness.dense_allreduce_step(layers, data_seed=hvd.rank())

    for _ in range(10):
        train_step()
    pipeline = lifecycle.get_pipeline()

    def switch(mode: str) -> None:
        pipeline._sampler = ALWAYS_OFF if mode == "untraced" else ALWAYS_ON
        pipeline._sample_fast = ids.fast_root_decision(pipeline._sampler)
        collector.every = 1 if mode == "arrivals" else 0

    # rotated: no mode always follows the same one
    times = harness.step_times(MODES, rounds, block, switch, train_step)
    harness.emit_result({"rank": hvd.rank(), "times": times})


def summarise(results: list, args: argparse.Namespace, load: float, spans: dict) -> str:
    lines = [
        f"horovodrun -np {args.np} --gloo, {args.layers} dense 256x256 gradients, response "
        f"cache on, {args.rounds} rounds x {args.block} steps per mode, interleaved; load "
        f"average {load:.1f} on {os.cpu_count()} cores; step time in ms",
        "",
        "| rank | mode | median | p90 | median vs steps (arrivals off) |",
        "|---|---|---|---|---|",
    ]
    lines += harness.per_rank_rows(results, MODES, "steps")
    lines += ["", f"spans written: {spans}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--doc", default=str(harness.RESULTS / "arrivals.md"))
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.block, args.layers)
        return
    tmp = tempfile.mkdtemp(prefix="bench_arrivals")
    # timing ops built; detail switched per block
    env = harness.horovod_env(tmp, TF_OTEL_HOROVOD_EVERY="1")
    argv = [__file__, "--worker", f"--rounds={args.rounds}", f"--block={args.block}"]
    argv += [f"--layers={args.layers}"]
    load = os.getloadavg()[0]
    job = harness.launch(harness.horovodrun(args.np, argv), env, timeout=900)
    results = harness.rank_results(job, args.np)
    spans: dict = {}
    for span in harness.written_spans(Path(tmp)):
        for a in span.get("attributes", []):
            if a["key"] in ("tf_otel.category", "horovod.arrival"):
                value = a["value"].get("stringValue")
                spans[value] = spans.get(value, 0) + 1
    table = summarise(results, args, load, spans)
    print(table)
    write_doc(
        Path(args.doc),
        "`bench/bench_arrivals.py` (see its docstring). Last run: "
        f"{time.strftime('%Y-%m-%d %H:%M')} UTC, "
        f"`{' '.join(['bench/bench_arrivals.py'] + sys.argv[1:])}`\n\n{table}\n",
    )


if __name__ == "__main__":
    main()
