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
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODES = ("untraced", "steps", "collectives")


def worker(rounds: int, block: int, layers: int) -> None:
    import tf_otel

    tf_otel.instrument()
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    from tf_otel.instrument.horovod.choice import OFF, choice
    from tf_otel.pipeline import lifecycle

    hvd.init()
    width = 256
    variables = [
        tf.Variable(tf.random.stateless_normal([width, width], seed=(i, 1)) * 0.05)
        for i in range(layers)
    ]
    x = tf.random.stateless_normal([32, width], seed=(9, 9))

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            h = x
            for v in variables:
                h = tf.nn.relu(tf.matmul(h, v))
            loss = tf.reduce_mean(h)
        grads = hvd.DistributedGradientTape(tape).gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(0.01 * g)
        return loss

    for _ in range(10):  # warm-up: tracing, cache fill
        train_step()
    pipeline = lifecycle.get_pipeline()
    managed = choice.mode
    times = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode in MODES:
            pipeline._sampler = ALWAYS_OFF if mode == "untraced" else ALWAYS_ON
            choice.mode = managed if mode == "collectives" else OFF
            for _ in range(block):
                t0 = time.perf_counter_ns()
                train_step()
                times[mode].append(time.perf_counter_ns() - t0)
    choice.mode = managed
    print("RESULT " + json.dumps({"rank": hvd.rank(), "mode": managed, "times": times}))


def summarise(results: list, backend: str, rounds: int, block: int, layers: int) -> str:
    lines = [
        f"horovodrun -np 2 --{backend}, {layers} dense 256x256 gradients (allreduce, fused), "
        f"{rounds} rounds x {block} steps per mode, interleaved; step time in ms",
        "",
        "| rank | mode | median | p90 | median vs untraced |",
        "|---|---|---|---|---|",
    ]
    for result in sorted(results, key=lambda r: r["rank"]):
        base = statistics.median(result["times"]["untraced"])
        for mode in MODES:
            values = sorted(result["times"][mode])
            median = statistics.median(values)
            p90 = values[int(len(values) * 0.9)]
            lines.append(
                f"| {result['rank']} | {mode} | {median / 1e6:.3f} | {p90 / 1e6:.3f} | "
                f"{median / base:.3f} |"
            )
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
    venv = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TF_OTEL_"))}
    tmp = tempfile.mkdtemp(prefix="bench_collectives")
    env.update(
        PATH=f"{venv}{os.pathsep}{env.get('PATH', '')}",
        TF_CPP_MIN_LOG_LEVEL="2",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OTEL_TRACES_EXPORTER="none",
        TF_OTEL_FILE=os.path.join(tmp, "spans-{rank}.jsonl"),  # spans are really built/written
        TMPDIR=tmp,
    )
    command = [
        str(venv / "horovodrun"),
        "-np",
        "2",
        "-H",
        "localhost:2",
        f"--{args.backend}",
        sys.executable,
        __file__,
        "--worker",
        f"--rounds={args.rounds}",
        f"--block={args.block}",
        f"--layers={args.layers}",
    ]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    results = []
    for line in out.stdout.splitlines():
        if "RESULT " in line:
            results.append(json.loads(line.split("RESULT ", 1)[1]))
    if len(results) != 2:
        sys.exit(f"bench failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    print(summarise(results, args.backend, args.rounds, args.block, args.layers))
    spans = sum(1 for p in Path(tmp).glob("spans-*.jsonl") for _ in open(p))
    print(f"\n(span batches written: {spans}; timeline mode on rank 0: {results[0]['mode']})")


if __name__ == "__main__":
    main()
