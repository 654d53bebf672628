"""CPU cost of one collective-detail step on the export side, in-process, no TensorFlow.

What a rank does for a detail step after the training thread has read its stamps: the export
thread shares the arrivals, rank 0 answers the last arrivals, the rank builds its collective
records, turns them into SDK spans and the batch processor encodes them (OTLP-JSON file, as
bench/bench_real_model.py writes them). All of that runs off the training thread, but on a 2-core
machine that TensorFlow keeps busy every CPU-second of it is taken from training, so CPU per
detail step is the number that bounds "collective detail on every step" (issue 13). CPU time is
far less noisy than throughput on a shared machine.

Real parts: tf_otel's Pipeline, StampCollector and OTel SDK with a BatchSpanProcessor and the
OTLP-JSON file exporter. It plays rank 0 of 2: rank 1's step reports and arrivals are fed in
through the calls its coordinator thread would make (the socket left out). The stamps mimic
MobileNetV2 under DistributedGradientTape: 158 tensors, rank 0 waiting 2 ms for rank 1 on a
quarter of them (so ~238 spans a step with the wait / transfer children).

    .venv/bin/python bench/bench_detail_cpu.py                    # 40 detail steps, 158 tensors
    .venv/bin/python bench/bench_detail_cpu.py --path both --rounds 4 --steps 30   # A/B
    .venv/bin/python bench/bench_detail_cpu.py --steps 20 --profile 40   # cProfile, all threads

``--path sdk`` is the path before the direct one (Tracer.start_span for every span, OTLP-JSON
through protobuf + MessageToDict); the printed ``spans_written`` shows what each path lost.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, List, Tuple

import harness

MOBILENETV2_TENSORS = 158


def _stamps(n: int) -> List[Any]:
    from tf_otel.sources import horovod_stamp_records as hs

    out = []
    for i in range(n):
        dims = [3, 3, 32, 32 + i] if i % 3 else [32 + i]
        name = f"DistributedGradientTape_Allreduce/cond_{i}/HorovodAllreduce_grads_{i}_0"
        out.append(hs.Stamp(name, "allreduce", "float32", str(dims), hs.nbytes("float32", dims)))
    return out


def run(steps: int, tensors: int, profile: int, exporter: str, path: str = "direct") -> dict:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from tf_otel import clock, record
    from tf_otel.config import Settings
    from tf_otel.instrument.horovod.stamps import collector, exchange
    from tf_otel.job.topology import Topology
    from tf_otel.otel.sdk import OtlpJsonFileExporter
    from tf_otel.runtime import lifecycle
    from tf_otel.runtime.steps import Pipeline

    profiles: List[cProfile.Profile] = []
    if profile:  # every thread's own profiler (export, batch processor, coordinator)
        original_run = threading.Thread.run

        def profiled_run(thread: threading.Thread) -> None:
            mine = cProfile.Profile()
            profiles.append(mine)
            mine.enable()
            try:
                original_run(thread)
            finally:
                mine.disable()

        threading.Thread.run = profiled_run  # type: ignore[method-assign]
    if path == "sdk":  # the path before issue 13's fast path: SDK start_span, protobuf JSON
        from tf_otel.otel import sdk, span_builder

        sdk.spans_to_otlp_json = sdk.proto_otlp_json  # type: ignore[assignment]
        span_builder.SpanBuilder._eligible = lambda self: False  # type: ignore[method-assign]
    tmp = tempfile.mkdtemp(prefix="bench_detail_cpu_")
    spans_path = os.path.join(tmp, "spans.jsonl")
    provider = TracerProvider()
    file_exporter = OtlpJsonFileExporter(spans_path)
    file_exporter.open()
    if exporter == "file":
        provider.add_span_processor(BatchSpanProcessor(file_exporter))  # type: ignore[arg-type]
    # rank 0 of 2: rank 1's step reports and arrivals are fed in below, as its coordinator
    # thread would (the same calls, minus the socket)
    topology = Topology(rank=0, world_size=2, job_id=f"bench-detail-{os.getpid()}")
    pipeline = Pipeline(Settings(), topology, provider)
    pipeline.exporter.clock_settled = True  # rank 0 is the reference clock; no rank 1 to sync with
    lifecycle._pipeline = pipeline
    collector.every = 1
    exchange.backend = "gloo"
    stamps = _stamps(tensors)
    rng = random.Random(7)
    profiler = cProfile.Profile() if profile else None

    # warm-up step: imports, first spans, the clock
    def one_step() -> None:
        handle = pipeline.begin_step("keras_train", "train_function", record.KERAS_TRAIN)
        started = handle.start_ns - clock.now_ns() + time.time_ns()
        found: List[Tuple[Any, int, int, Any]] = []
        other = {}  # rank 1's arrivals (reference clock; rank 0's offset is 0)
        to_local = clock.now_ns() - time.time_ns()
        t = started + 1_000_000
        for stamp in stamps:
            t += rng.randint(20_000, 200_000)
            wait = rng.choice((0, 0, 0, 2_000_000))  # rank 0 waits >= 1 ms on a quarter
            found.append((stamp, t, t + wait + rng.randint(100_000, 900_000), None))
            other[stamp.tensor] = t + to_local + (wait or -50_000)
        key, step = handle.key, handle.step
        exchange.hold(key, step, found)
        handle.deferred.append(lambda: exchange.share_pending(key, step))
        time.sleep(0.03)  # the step's span covers its collectives
        pipeline.end_step(handle)
        aggregator = pipeline.exporter.services.aggregator
        assert aggregator is not None
        aggregator.add(1, key, step, handle.start_ns, handle.end_ns)
        exchange.on_arrivals(1, {"t": "hvd.a", "k": key, "s": step, "a": other})

    one_step()
    pipeline.wake()
    time.sleep(1.0)
    provider.force_flush()
    cpu0, wall0 = time.process_time(), time.monotonic()
    if profiler is not None:
        profiler.enable()
    main_cpu = 0.0  # the fake stamps and rank 1's messages: not the cost being measured
    for _ in range(steps):
        t0 = time.thread_time()
        one_step()
        main_cpu += time.thread_time() - t0
        pipeline.wake()
        time.sleep(0.02)
    pipeline.shutdown()
    provider.force_flush()
    if profiler is not None:
        profiler.disable()
    cpu = time.process_time() - cpu0 - main_cpu
    wall = time.monotonic() - wall0
    spans = sum(1 for _ in harness.written_spans(Path(tmp), "spans.jsonl"))
    size = os.path.getsize(spans_path) if os.path.exists(spans_path) else 0
    result = {
        "steps": steps,
        "tensors": tensors,
        "exporter": exporter,
        "path": path,
        "cpu_s": round(cpu, 3),
        "wall_s": round(wall, 3),
        "cpu_ms_per_detail_step": round(cpu * 1000 / steps, 2),
        "spans_written": spans,
        "spans_per_step": round(spans / max(steps + 1, 1), 1),
        "us_per_span": round(cpu * 1e6 / max(spans * steps / (steps + 1), 1), 1),
        "bytes_per_step": size // max(steps + 1, 1),
    }
    if profiler is not None:
        time.sleep(0.5)  # the batch processor's thread ends its profile
        stats = pstats.Stats(profiler)
        for other in profiles:
            stats.add(other)
        stats.sort_stats("cumulative").print_stats(profile)
        stats.sort_stats("tottime").print_stats(profile)
    Path(spans_path).unlink(missing_ok=True)
    os.rmdir(tmp)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--tensors", type=int, default=MOBILENETV2_TENSORS)
    parser.add_argument("--profile", type=int, default=0, help="print the top N functions")
    parser.add_argument("--exporter", choices=("file", "none"), default="file")
    parser.add_argument(
        "--path",
        choices=("direct", "sdk", "both"),
        default="direct",
        help="span building/encoding: tf_otel's direct path, the SDK+protobuf path, or both "
        "interleaved over --rounds fresh processes",
    )
    parser.add_argument("--rounds", type=int, default=1, help="with --path both")
    args = parser.parse_args()
    if args.path != "both":
        print(json.dumps(run(args.steps, args.tensors, args.profile, args.exporter, args.path)))
        return

    def one_process(_: int, path: str) -> float:
        command = [sys.executable, __file__, f"--steps={args.steps}", f"--path={path}"]
        command += [f"--tensors={args.tensors}", f"--exporter={args.exporter}"]
        row = json.loads(harness.launch(command, timeout=600).stdout.strip().splitlines()[-1])
        print(json.dumps(row), flush=True)
        return row["cpu_ms_per_detail_step"]

    results = harness.interleaved(["sdk", "direct"], args.rounds, one_process)
    load = os.getloadavg()[0]
    sdk_ms, direct_ms = statistics.median(results["sdk"]), statistics.median(results["direct"])
    print(
        f"CPU per detail step ({args.tensors} tensors, {args.exporter}), median of "
        f"{args.rounds}: sdk path {sdk_ms:.1f} ms, direct path {direct_ms:.1f} ms "
        f"({sdk_ms / direct_ms:.1f}x less); load {load:.1f}"
    )


if __name__ == "__main__":
    main()
