"""Cost of exact per-rank arrivals (the default collective source) per sampled step, N ranks,
side by side with arrivals off, in one horovodrun job (same processes, same warm graph, same
machine load), modes switched every BLOCK steps on every rank, order rotated each round:

  untraced   step not sampled
  steps      step sampled, no collective detail (arrivals off)
  arrivals   step sampled, collective detail: stamps read, sent to rank 0, last arrivals
             broadcast, collective / wait / transfer spans written (TF_OTEL_FILE)

Horovod's response cache stays on (its default). The graph carries the stamp ops in every mode
(they are built once); their standing cost is in docs/BENCHMARKS_real_model.md.

    .venv/bin/python bench/bench_arrivals.py [--np 4] [--rounds 6] [--block 10] [--layers 24]
Prints a markdown table and writes docs/BENCHMARKS_arrivals.md.
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
MODES = ("untraced", "steps", "arrivals")


def worker(rounds: int, block: int, layers: int) -> None:
    import tf_otel

    tf_otel.instrument()
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    from tf_otel.instrument.horovod.stamps import collector
    from tf_otel.pipeline import ids, lifecycle

    hvd.init()
    width = 256
    variables = [
        tf.Variable(tf.random.stateless_normal([width, width], seed=(i, 1)) * 0.05)
        for i in range(layers)
    ]
    x = tf.random.stateless_normal([32, width], seed=(9, hvd.rank()))

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

    for _ in range(10):
        train_step()
    pipeline = lifecycle.get_pipeline()
    times = {m: [] for m in MODES}
    for round_no in range(rounds):
        shift = round_no % len(MODES)  # rotated: no mode always follows the same one
        for mode in MODES[shift:] + MODES[:shift]:
            pipeline._sampler = ALWAYS_OFF if mode == "untraced" else ALWAYS_ON
            pipeline._sample_fast = ids.fast_root_decision(pipeline._sampler)
            collector.every = 1 if mode == "arrivals" else 0
            for _ in range(block):
                t0 = time.perf_counter_ns()
                train_step()
                times[mode].append(time.perf_counter_ns() - t0)
    print("RESULT " + json.dumps({"rank": hvd.rank(), "times": times}), flush=True)


def summarise(results: list, args: argparse.Namespace, load: float, spans: dict) -> str:
    lines = [
        f"horovodrun -np {args.np} --gloo, {args.layers} dense 256x256 gradients, response "
        f"cache on, {args.rounds} rounds x {args.block} steps per mode, interleaved; load "
        f"average {load:.1f} on {os.cpu_count()} cores; step time in ms",
        "",
        "| rank | mode | median | p90 | median vs steps (arrivals off) |",
        "|---|---|---|---|---|",
    ]
    for result in sorted(results, key=lambda r: r["rank"]):
        base = statistics.median(result["times"]["steps"])
        for mode in MODES:
            values = sorted(result["times"][mode])
            median = statistics.median(values)
            lines.append(
                f"| {result['rank']} | {mode} | {median / 1e6:.3f} | "
                f"{values[int(len(values) * 0.9)] / 1e6:.3f} | {median / base:.3f} |"
            )
    lines += ["", f"spans written: {spans}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--doc", default=str(REPO / "docs" / "BENCHMARKS_arrivals.md"))
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.block, args.layers)
        return
    venv = Path(sys.executable).parent
    tmp = tempfile.mkdtemp(prefix="bench_arrivals")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TF_OTEL_"))}
    env.update(
        PATH=f"{venv}{os.pathsep}{env.get('PATH', '')}",
        TF_CPP_MIN_LOG_LEVEL="2",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OTEL_TRACES_EXPORTER="none",
        TF_OTEL_FILE=os.path.join(tmp, "spans-{rank}.jsonl"),
        TMPDIR=tmp,
        TF_OTEL_HOROVOD_EVERY="1",  # timing ops built; detail switched per block
    )
    command = [str(venv / "horovodrun"), "-np", str(args.np), "-H", f"localhost:{args.np}"]
    command += ["--gloo", sys.executable, __file__, "--worker", f"--rounds={args.rounds}"]
    command += [f"--block={args.block}", f"--layers={args.layers}"]
    load = os.getloadavg()[0]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    results = [
        json.loads(line.split("RESULT ", 1)[1])
        for line in out.stdout.splitlines()
        if "RESULT " in line
    ]
    if len(results) != args.np:
        sys.exit(f"bench failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    spans: dict = {}
    for path in Path(tmp).glob("spans-*.jsonl"):
        for line in open(path):
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    for span in ss.get("spans", []):
                        for a in span.get("attributes", []):
                            if a["key"] in ("tf_otel.category", "horovod.arrival"):
                                value = a["value"].get("stringValue")
                                spans[value] = spans.get(value, 0) + 1
    table = summarise(results, args, load, spans)
    print(table)
    Path(args.doc).write_text(
        "# Exact per-rank arrivals: cost per sampled step\n\n`bench/bench_arrivals.py` "
        "(see its docstring). Last run: "
        f"{time.strftime('%Y-%m-%d %H:%M')} UTC, "
        f"`{' '.join(['bench/bench_arrivals.py'] + sys.argv[1:])}`\n\n{table}\n"
    )


if __name__ == "__main__":
    main()
