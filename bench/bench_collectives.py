"""Overhead of Horovod collective tracing: step time with collectives traced vs untraced,
interleaved in one horovodrun -np 2 job (same processes, same warm graph, same machine load).

Modes, switched every BLOCK steps in a fixed round-robin on both ranks:
  untraced     step not sampled (tf_otel active: the cost every unsampled step pays)
  steps        step sampled, collective tracing off (step spans only)
  collectives  step sampled, collective tracing on (timeline started/stopped, parsed, sent)

Run:  .venv/bin/python bench/bench_collectives.py [--rounds 10] [--block 20] [--backend gloo]
Prints a markdown table (median / p90 step time per mode on rank 0 and rank 1, ratios).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import harness

REPO = Path(__file__).resolve().parent.parent
MODES = ("untraced", "steps", "collectives")


def worker(rounds: int, block: int, layers: int) -> None:
    import tf_otel

    tf_otel.instrument()
    import horovod.tensorflow as hvd
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    from tf_otel.instrument.horovod.collective_source import OFF, choice
    from tf_otel.runtime import lifecycle

    hvd.init()
    train_step = harness.dense_allreduce_step(layers, data_seed=9)

    for _ in range(10):  # warm-up: tracing, cache fill
        train_step()
    pipeline = lifecycle.get_pipeline()
    managed = choice.mode

    def switch(mode: str) -> None:
        pipeline._sampler = ALWAYS_OFF if mode == "untraced" else ALWAYS_ON
        choice.mode = managed if mode == "collectives" else OFF

    # the same order every round, as the docstring says (not rotated as the other benches)
    times = harness.step_times(MODES, rounds, block, switch, train_step, rotate=False)
    choice.mode = managed
    harness.emit_result({"rank": hvd.rank(), "mode": managed, "times": times})


def summarise(results: list, backend: str, rounds: int, block: int, layers: int) -> str:
    lines = [
        f"horovodrun -np 2 --{backend}, {layers} dense 256x256 gradients (allreduce, fused), "
        f"{rounds} rounds x {block} steps per mode, interleaved; step time in ms",
        "",
        "| rank | mode | median | p90 | median vs untraced |",
        "|---|---|---|---|---|",
    ]
    lines += harness.per_rank_rows(results, MODES, "untraced")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.block, args.layers)
        return
    tmp = tempfile.mkdtemp(prefix="bench_collectives")
    env = harness.horovod_env(tmp)  # spans are really built/written
    argv = [__file__, "--worker", f"--rounds={args.rounds}", f"--block={args.block}"]
    argv += [f"--layers={args.layers}"]
    job = harness.launch(harness.horovodrun(2, argv, args.backend), env, timeout=900)
    results = harness.rank_results(job, 2)
    print(summarise(results, args.backend, args.rounds, args.block, args.layers))
    spans = sum(1 for p in Path(tmp).glob("spans-*.jsonl") for _ in open(p))
    print(f"\n(span batches written: {spans}; timeline mode on rank 0: {results[0]['mode']})")


if __name__ == "__main__":
    main()
