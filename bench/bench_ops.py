"""Op-level tracing cost, in one process, modes interleaved round-robin (machines are noisy):

- TF2 custom loop (a tf.function MLP step) and TF1 Session.run, each with step tracing on and
  op tracing: off / every 100th step / every step; beside the TF profiler's own cost measured
  the same way (a profiler session around every step, no tf_otel conversion) and, for TF1,
  FULL_TRACE alone. Ratios are of median block times against "off".
- conversion throughput: a real 10k-op step (TF1 step_stats of a 476-iteration while loop, TF2
  XSpace of a 3300-iteration one at host_tracer_level 3), converted (capped at 500 and uncapped), made into spans and OTLP-encoded,
  in thread CPU time (what the export thread spends).

    .venv/bin/python bench/bench_ops.py [--rounds 6] [--block 200] [--out docs/benchmarks/ops.md]

The tables go between the doc's generated-section markers (harness.write_generated); the
hand-written rest of the file (the reading below them) stays. TensorFlow is imported by main()
(after tf_otel.instrument()), not at import: tests/test_bench_docs.py imports write_doc.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

import harness

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
TITLE = "Op-level tracing benchmarks"

# bound by _load_tensorflow(), called by main()
np: Any = None
tf: Any = None
_pywrap_profiler: Any = None
ops: Any = None  # tf_otel.instrument.ops.hook
PROFILER_OPTIONS: Dict[str, Any] = {}


def _load_tensorflow() -> None:
    """tf_otel instrumented, then TensorFlow and the op hook imported into this module."""
    global np, tf, _pywrap_profiler, ops, PROFILER_OPTIONS
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["OTEL_TRACES_EXPORTER"] = "none"  # spans are built, not sent
    os.environ.pop("TF_OTEL_OPS_EVERY", None)

    import tf_otel

    tf_otel.instrument()

    import numpy as np
    import tensorflow as tf
    from tensorflow.python.profiler.internal import _pywrap_profiler

    from tf_otel.instrument.ops import hook as ops

    PROFILER_OPTIONS = dict(ops._PROFILER_OPTIONS)


def profiled(fn):
    """The TF profiler's own cost: a session around the step, exported, nothing parsed."""
    logdir = tempfile.mkdtemp(prefix="bench_prof_")
    session = _pywrap_profiler.ProfilerSession()
    session.start(logdir, dict(PROFILER_OPTIONS))
    fn()
    session.export_to_tb()
    shutil.rmtree(logdir, ignore_errors=True)


def blocks(modes, rounds, block):
    """{mode: [seconds per step of each block]}, modes interleaved round-robin (order rotated)."""

    def timed(_, name):
        setup, step = modes[name]
        setup()
        t0 = time.perf_counter()
        for _ in range(block):
            step()
        return (time.perf_counter() - t0) / block

    times = harness.interleaved(list(modes), rounds, timed)
    ops.controller.every = 0
    return times


def every(n):
    def setup():
        ops.controller.every = n

    return setup


def op_modes(step, name, alone):
    """Op tracing off / every 100th step / every step of `step`, and `alone` (what the tracing
    builds on, without tf_otel's conversion) as `name`."""
    return {
        "off": (every(0), step),
        "every 100": (every(100), step),
        "every step": (every(1), step),
        name: (every(0), alone),
    }


def tf2_modes():
    w1 = tf.Variable(tf.random.normal([256, 256]) * 0.05)
    w2 = tf.Variable(tf.random.normal([256, 10]) * 0.05)
    x = tf.random.normal([128, 256])

    @tf.function
    def train_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)))
        g1, g2 = tape.gradient(loss, [w1, w2])
        w1.assign_sub(0.01 * g1)
        w2.assign_sub(0.01 * g2)
        return loss

    def step():
        train_step(x)

    for _ in range(20):
        step()
    return op_modes(step, "TF profiler every step", lambda: profiled(step))


def tf1_modes():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 256])
        w1 = tf.compat.v1.get_variable("w1", [256, 256])
        w2 = tf.compat.v1.get_variable("w2", [256, 10])
        loss = tf.reduce_mean(tf.square(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    sess = tf.compat.v1.Session(graph=graph)
    sess.run(init)
    feed = {x: np.random.default_rng(0).normal(size=(128, 256)).astype("float32")}
    full = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)

    def step():
        sess.run([loss, train], feed)

    def full_trace():
        sess.run([loss, train], feed, options=full, run_metadata=tf.compat.v1.RunMetadata())

    for _ in range(20):
        step()
    return op_modes(step, "FULL_TRACE alone every step", full_trace), sess


def ten_k_op_artifacts():
    """Real TF1 step_stats and TF2 XSpace of a step running ~10k ops (a while loop)."""
    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.placeholder(tf.float32, [4])

        def body(i, a):
            return i + 1, tf.tanh(a * 1.0001 + 0.5)

        _, out = tf.compat.v1.while_loop(lambda i, a: i < 476, body, [tf.constant(0), v])
    with tf.compat.v1.Session(graph=graph) as sess:
        metadata = tf.compat.v1.RunMetadata()
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        ops.controller.every = 0
        sess.run(out, {v: np.ones(4, "float32")}, options=options, run_metadata=metadata)

    @tf.function
    def loop(a):
        return tf.while_loop(
            lambda i, a: i < 3300, lambda i, a: (i + 1, tf.tanh(a * 1.0001 + 0.5)), [0, a]
        )[1]

    loop(tf.ones(4))
    logdir = tempfile.mkdtemp(prefix="bench_xspace_")
    session = _pywrap_profiler.ProfilerSession()
    base_ns = time.time_ns()
    session.start(logdir, {**PROFILER_OPTIONS, "host_tracer_level": 3})  # every op, not only
    loop(tf.ones(4))  # the expensive ones: ~3 events per iteration
    session.export_to_tb()
    return metadata.step_stats, logdir, base_ns


def conversion(step_stats, logdir, base_ns, repeats=5):
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tf_otel.config import Settings
    from tf_otel.job.topology import Topology
    from tf_otel.runtime.steps import Pipeline
    from tf_otel.sources.step_stats import cap_records, step_stats_capped, step_stats_records

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    pipeline = Pipeline(Settings(), Topology(job_id="bench"), tracer_provider=provider)
    tracer = pipeline._tracer
    results = {}
    for source in ("step_stats", "step_stats (all Records, then cap)", "xspace"):
        for limit in (500, 0):
            cpu = []
            for _ in range(repeats):
                exporter.clear()
                t0 = time.thread_time_ns()
                if source == "step_stats":  # what ops.py runs
                    records = step_stats_capped(step_stats, 1, limit)
                elif source.startswith("step_stats"):  # before: every node a Record
                    records = cap_records(step_stats_records(step_stats, 1), limit, 1)
                else:
                    records = ops.xspace_records(logdir, 1, limit, base_ns)
                t1 = time.thread_time_ns()
                lo = min(r.start_ns for r in records)
                hi = max(r.end_ns for r in records)
                step_span = tracer.start_span("step", start_time=lo)
                step_span.end(end_time=hi)
                pipeline.exporter.export_records(1, records, step_span.get_span_context(), lo, hi)
                encoded = encode_spans(exporter.get_finished_spans()).SerializeToString()
                t2 = time.thread_time_ns()
                cpu.append((t1 - t0, t2 - t1, len(records), len(encoded)))
            # median run (by total) of `repeats`; GC pauses make single runs jump
            cpu.sort(key=lambda c: c[0] + c[1])
            results[(source, limit)] = cpu[len(cpu) // 2]
    return results


def median_ci(values):
    """Distribution-free ~95 % confidence interval of the median (order statistics,
    normal approximation of the binomial): sorted[k], sorted[n-1-k], k = n/2 - 0.98 sqrt(n)."""
    ordered = sorted(values)
    n = len(ordered)
    k = max(0, int(n / 2 - 0.98 * n**0.5))
    return ordered[k], ordered[n - 1 - k]


def report(tf2, tf1, conv, total_ops, args):
    """Markdown of the parts that ran (tf2/tf1 None: overhead skipped; conv None: conversion)."""

    def table(times, title):
        base = statistics.median(times["off"])
        rows = [
            f"### {title}",
            "",
            "| mode | median ms / step | ratio of medians "
            "| per-round ratio: median [q1, q3] | 95 % CI of that median |",
            "|---|---|---|---|---|",
        ]
        for name, values in times.items():
            med = statistics.median(values)
            # each round's block against that round's "off" block; quartiles show the spread
            # the load leaves
            paired = harness.paired_ratios(values, times["off"])
            ratio, q1, q3 = harness.median_quartiles(paired)
            lo, hi = median_ci(paired)
            rows.append(
                f"| {name} | {med * 1e3:.3f} | {med / base:.3f}× "
                f"| {ratio:.3f}× [{q1:.3f}, {q3:.3f}] | {lo:.3f}–{hi:.3f} |"
            )
        per = statistics.median(times["every step"]) - base
        rows += [
            "",
            f"Per op-traced step: +{per * 1e3:.2f} ms over a {base * 1e3:.2f} ms step; at every "
            f"100th step that is {1 + per / 100 / base:.3f}× (per-step cost / 100 / step time).",
            "",
        ]
        return rows

    lines = [
        f"`bench/bench_ops.py --rounds {args.rounds} --block {args.block}` on {platform.node()} "
        f"({os.cpu_count()} cores, shared; TF {tf.__version__} CPU). Modes interleaved "
        "round-robin (order rotated each round) in one process, `rounds` blocks of `block` steps each; step tracing on in "
        "every mode (OTEL_TRACES_EXPORTER=none), so ratios isolate op tracing.",
        "",
        f"Load average at the end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}.",
        "",
    ]
    if tf2 is not None:
        lines += table(tf2, "TF2 tf.function step (MLP 128×256×256×10), XSpace path")
        lines += table(tf1, "TF1 Session.run (same model), FULL_TRACE step_stats path")
    if conv is None:
        return "\n".join(lines) + "\n"
    lines += [
        f"### Conversion of one ~10k-op step (step_stats: {total_ops} node executions) (thread CPU, off the training thread)",
        "",
        "| source | cap | records | convert ms | spans + OTLP encode ms | total ms |",
        "|---|---|---|---|---|---|",
    ]
    for (source, limit), (convert, export, n, _) in conv.items():
        lines.append(
            f"| {source} | {limit or 'none'} | {n} | {convert / 1e6:.1f} | {export / 1e6:.1f} "
            f"| {(convert + export) / 1e6:.1f} |"
        )
    return "\n".join(lines) + "\n"


def write_doc(path: Path, text: str) -> None:
    """``text`` as the generated section of the doc at ``path``; the rest of the file stays."""
    harness.write_generated(path, "bench_ops", text, TITLE)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5, help="conversion runs (median kept)")
    parser.add_argument("--parts", default="overhead,conversion")
    parser.add_argument("--out", default=str(harness.RESULTS / "ops.md"))
    args = parser.parse_args()
    _load_tensorflow()
    parts = set(args.parts.split(","))
    conv = tf1 = tf2 = None
    total_ops = 0
    if "conversion" in parts:
        step_stats, logdir, base_ns = ten_k_op_artifacts()
        total_ops = sum(len(d.node_stats) for d in step_stats.dev_stats)
        conv = conversion(step_stats, logdir, base_ns, args.repeats)
        shutil.rmtree(logdir, ignore_errors=True)
    if "overhead" in parts:
        tf2 = blocks(tf2_modes(), args.rounds, args.block)
        modes, sess = tf1_modes()
        tf1 = blocks(modes, args.rounds, args.block)
        sess.close()
    text = report(tf2, tf1, conv, total_ops, args)
    print(text)
    if args.out:
        write_doc(Path(args.out), text)


if __name__ == "__main__":
    main()
