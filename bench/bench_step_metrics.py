"""Cost of the step histograms (tf_otel/metrics/step_metrics.py), side by side and interleaved.

1. Training thread: ``begin_step`` + ``end_step`` of an unsampled step (sampler off: the path
   every step takes at ratio 0, and most steps at low ratios) with the step metrics on (one
   bounded deque append) and off, in alternating blocks in one process, on a real SDK
   MeterProvider and TracerProvider.
2. Export thread: CPU (thread time) per step recorded, for buffered unsampled steps
   (``drain``: step duration + input wait) and for a sampled step with its exemplar context
   (``record_step``). Off the training thread, but on 2 cores every CPU µs is shared.

    .venv/bin/python bench/bench_step_metrics.py [--rounds 30] [--block 10000]

Writes the table into docs/benchmarks/step_metrics.md (--out), between its generated-section
markers (harness.write_generated: the hand-written rest of the file stays).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import harness

REPO = Path(__file__).resolve().parent.parent
TITLE = "Step histograms: cost per step (bench/bench_step_metrics.py)"


def write_doc(path: Path, text: str) -> None:
    """``text`` as the generated section of the doc at ``path``; the rest of the file stays."""
    harness.write_generated(path, "bench_step_metrics", text, TITLE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--block", type=int, default=10000)  # < MAX_PENDING
    parser.add_argument("--out", default=str(harness.RESULTS / "step_metrics.md"))
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))

    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
    from opentelemetry.trace import SpanContext, TraceFlags

    from tf_otel.config import Settings
    from tf_otel.job.topology import Topology
    from tf_otel.runtime.steps import Pipeline
    from tf_otel.step_handle import StepHandle

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    trace.set_tracer_provider(TracerProvider(sampler=ALWAYS_OFF))
    pipeline = Pipeline(Settings(), Topology(job_id="bench-metrics", host="bench"))
    step_metrics = pipeline._metrics
    assert step_metrics is not None, "no SDK MeterProvider"

    def block(on: bool) -> float:
        pipeline._metrics = pipeline.exporter.metrics = step_metrics if on else None
        begin, end = pipeline.begin_step, pipeline.end_step
        t0 = time.perf_counter_ns()
        for _ in range(args.block):
            end(begin("bench", "bench_step", "tf_function"))
        elapsed = time.perf_counter_ns() - t0
        step_metrics.pending.clear()  # the export thread's share is measured below
        return elapsed / args.block / 1000

    block(True)  # warm up (pipeline start, caches)
    blocks = harness.interleaved(
        [True, False], args.rounds, lambda _, metrics_on: block(metrics_on)
    )
    on, off = blocks[True], blocks[False]
    pipeline._metrics = pipeline.exporter.metrics = step_metrics

    # export thread: CPU per recorded step
    handle = StepHandle("bench", 0, "bench_step", "tf_function", 0, True, 0, 12_000_000)
    waited = StepHandle("bench", 0, "bench_step", "tf_function", 0, True, 0, 12_000_000)
    waited.input_wait_ns = 3_000_000
    drain_us, drain_wait_us, sampled_us = [], [], []
    n = min(args.block, 10_000)
    span = SpanContext(0xABC, 0x123, False, TraceFlags(TraceFlags.SAMPLED))
    for _ in range(args.rounds):
        for target, h in ((drain_us, handle), (drain_wait_us, waited)):
            for _ in range(n):
                step_metrics.add(h)
            t0 = time.thread_time_ns()
            step_metrics.drain()
            target.append((time.thread_time_ns() - t0) / n / 1000)
        t0 = time.thread_time_ns()
        for _ in range(n):
            step_metrics.record_step(handle, span)
        sampled_us.append((time.thread_time_ns() - t0) / n / 1000)
    reader.get_metrics_data()
    pipeline.shutdown(2.0)

    med_on, med_off = statistics.median(on), statistics.median(off)
    diffs = sorted(a - b for a, b in zip(on, off))
    text = f"""OpenTelemetry SDK {_sdk_version()}, Python {sys.version.split()[0]}; {args.rounds} rounds,
blocks of {args.block} steps with the step metrics on and off in alternating order in one
process. Load average at the end: {os.getloadavg()[0]:.1f} (2 cores, shared).

| | µs per step |
|---|---:|
| training thread, unsampled step, metrics off (begin + end) | {med_off:.2f} |
| training thread, unsampled step, metrics on | {med_on:.2f} |
| difference (median of paired rounds; range) | **{statistics.median(diffs):.2f}** ({diffs[0]:.2f} – {diffs[-1]:.2f}) |
| export thread, CPU per unsampled step recorded (duration) | {statistics.median(drain_us):.1f} |
| export thread, CPU per unsampled step recorded (duration + input wait) | {statistics.median(drain_wait_us):.1f} |
| export thread, CPU per sampled step recorded with its exemplar | {statistics.median(sampled_us):.1f} |
"""
    write_doc(Path(args.out), text)
    print(text)


def _sdk_version() -> str:
    from importlib.metadata import version

    return version("opentelemetry-sdk")


if __name__ == "__main__":
    main()
