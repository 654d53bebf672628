"""Cost of tf_otel on real models: img/sec of a keras.applications model trained with Horovod's
DistributedGradientTape on synthetic data (what Horovod's tensorflow2_synthetic_benchmark does,
written here: the PyPI sdist does not ship Horovod's examples), 2 CPU ranks, gloo, tf_keras.

One ``horovodrun -np 2 --gloo`` job per (mode, model, round); the modes of a round run in a
rotated order, so slow and fast windows of a shared machine fall on every mode. Modes:

  untraced      no tf_otel
  untraced_aa   no tf_otel again: the A/A control (its ratio to untraced is the run's noise)
  defaults      TF_OTEL_ENABLED=1 (zero-code defaults, always-on sampler)
  steps_only    TF_OTEL_HOROVOD=0: step spans only
  coll_every    collective detail on every step (TF_OTEL_HOROVOD_EVERY=1)
  coll_every_parts  coll_every with wait / transfer children (TF_OTEL_HOROVOD_PARTS=1; by
                default a collective-detail step on every step has one span per collective,
                its wait in horovod.wait_ns)
  coll_every_sdk  coll_every with the SDK span path (start_span, protobuf JSON) it replaced
  defaults_otlp, coll_every_otlp  the same, spans over OTLP/gRPC (the SDK's exporter) to a sink
                that keeps the bytes and decodes them after the job (it only receives meanwhile)
  coll_1in100   collective detail on 1 step in 100 (TF_OTEL_HOROVOD_EVERY=100)
  ops_100       op detail every 100th step (TF_OTEL_OPS_EVERY=100: steps 0, 100, ... on every
                rank; the timed window, steps warmup+1 ... warmup+steps, holds step 100)
  hvd_timeline  Horovod's own HOROVOD_TIMELINE=<file>, no tf_otel (the anchor)
  untraced_data no tf_otel, batches from a tf.data pipeline of the same synthetic tensors
  defaults_data defaults with those batches (the eager next() is timed, instrument/data.py;
                compared with untraced_data as well)
  input_wait    defaults_data + TF_OTEL_INPUT_WAIT=1 (the timing tail on this custom loop's own
                iterator too; compared with defaults_data as well)

Spans are really built and written (TF_OTEL_FILE, OTLP-JSON); the table counts them per
category so a mode that silently recorded nothing shows. Prints the ratio table with the load
average and writes it into docs/benchmarks/real_model.md (--doc), between the file's
generated-section markers (harness.write_generated; --inprocess: its own section): the
hand-written rest of the file stays.

    .venv/bin/python bench/bench_real_model.py                 # 3 rounds, both models
    .venv/bin/python bench/bench_real_model.py --rounds 1 --quick
    .venv/bin/python bench/bench_real_model.py --modes untraced,defaults --models mobilenetv2
    # the steady cost in one job (paired and bracketed blocks, A/A control), ranks pinned
    BENCH_INPROCESS_MODES=untraced,untraced_aa,coll_1in20 .venv/bin/python \
        bench/bench_real_model.py --inprocess --pin --side 128 --rounds 50 --block 4

The run time is estimated up front (and again after each run, from the runs so far).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional

import harness

DOC = harness.RESULTS / "real_model.md"

MODES: Dict[str, Dict[str, str]] = {
    "untraced": {},
    "untraced_aa": {},  # the A/A control: untraced again, its ratio is the run's noise
    "defaults": {"TF_OTEL_ENABLED": "1"},
    "steps_only": {"TF_OTEL_ENABLED": "1", "TF_OTEL_HOROVOD": "0"},
    "coll_every": {"TF_OTEL_ENABLED": "1", "TF_OTEL_HOROVOD_EVERY": "1"},
    # with wait / transfer children (the default has them only for detail 1 step in >= 10)
    "coll_every_parts": {
        "TF_OTEL_ENABLED": "1",
        "TF_OTEL_HOROVOD_EVERY": "1",
        "TF_OTEL_HOROVOD_PARTS": "1",
    },
    # the same with spans built by the SDK's start_span and the file written through protobuf
    # (before the direct path): its threads' CPU against coll_every's
    "coll_every_sdk": {"TF_OTEL_ENABLED": "1", "TF_OTEL_HOROVOD_EVERY": "1", "BENCH_SDK_PATH": "1"},
    # the same over OTLP/gRPC (the SDK's protobuf exporter) to a sink on this machine that keeps
    # the request bytes and decodes them after the job: the path users run
    "defaults_otlp": {"TF_OTEL_ENABLED": "1", "BENCH_OTLP": "1"},
    "coll_every_otlp": {"TF_OTEL_ENABLED": "1", "TF_OTEL_HOROVOD_EVERY": "1", "BENCH_OTLP": "1"},
    "coll_1in100": {"TF_OTEL_ENABLED": "1", "TF_OTEL_HOROVOD_EVERY": "100"},
    "ops_100": {"TF_OTEL_ENABLED": "1", "TF_OTEL_OPS_EVERY": "100"},
    "hvd_timeline": {"HOROVOD_TIMELINE": "{tmp}/horovod_timeline.json"},
    "untraced_data": {"BENCH_DATA": "dataset"},
    "defaults_data": {"TF_OTEL_ENABLED": "1", "BENCH_DATA": "dataset"},
    "input_wait": {"TF_OTEL_ENABLED": "1", "TF_OTEL_INPUT_WAIT": "1", "BENCH_DATA": "dataset"},
}
# modes compared with another mode as well as with untraced
PAIRED = {"input_wait": "defaults_data", "defaults_data": "untraced_data"}
GOALS = {
    "defaults": 0.99,
    "defaults_otlp": 0.99,
    "defaults_data": 0.99,
    "coll_every_otlp": 0.90,
    "steps_only": None,
    "coll_every": 0.95,
    "coll_every_parts": 0.90,
    "coll_1in100": 0.99,
    "ops_100": 0.98,
    "input_wait": 0.99,
}
# name -> (keras.applications class, input side, timed steps, quick timed steps)
MODELS = {
    "mobilenetv2": ("MobileNetV2", 224, 40, 16),
    "mobilenetv3small": ("MobileNetV3Small", 128, 100, 40),
    "efficientnetb0": ("EfficientNetB0", 160, 40, 16),
}
# modes that need a longer timed window: op detail every 100th step times steps 6..105 (after
# 1 + 5 warm-up steps), so step 100 is op-traced inside the window, once per 100 steps as in a
# long job, and its export (off-thread, batched) falls inside the window too
MODE_MIN_STEPS = {"ops_100": 100}
# run-time estimate: seconds per step on 2 CPU ranks (batch 8) and per job start (horovodrun,
# TF import, model build, first trace); corrected from the measured runs as they finish
STEP_S = {"mobilenetv2": 0.40, "mobilenetv3small": 0.10, "efficientnetb0": 0.45}
START_S = 40.0


# -- worker (one rank) ------------------------------------------------------------------------


def worker(model_name: str, batch: int, warmup: int, steps: int) -> None:
    if os.environ.get("BENCH_SDK_PATH") == "1":  # the span path before issue 13's direct one
        from tf_otel.otel import sdk, span_builder

        sdk.spans_to_otlp_json = sdk.proto_otlp_json  # type: ignore[assignment]
        span_builder.SpanBuilder._eligible = lambda self: False  # type: ignore[method-assign]
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    cls, side, _, _ = MODELS[model_name]
    model = getattr(tf.keras.applications, cls)(weights=None, input_shape=(side, side, 3))
    optimizer = tf.keras.optimizers.SGD(0.01 * hvd.size())
    images = tf.random.uniform([batch, side, side, 3], seed=1)
    labels = tf.random.uniform([batch, 1], minval=0, maxval=999, dtype=tf.int64, seed=2)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()

    batches = None
    if os.environ.get("BENCH_DATA") == "dataset":  # the same tensors, through tf.data
        dataset = tf.data.Dataset.from_tensors((images, labels)).repeat().prefetch(2)
        batches = iter(dataset)

    def next_batch() -> tuple:
        return next(batches) if batches is not None else (images, labels)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor, first_batch: bool) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:  # same start on every rank
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        return loss

    train_step(*next_batch(), True)
    for _ in range(warmup):
        train_step(*next_batch(), False)
    profile = os.environ.get("BENCH_PROFILE") == "1"
    windows: List[dict] = []
    started = time.perf_counter()
    mark, mark_cpu = started, _os_thread_cpu() if profile else {}
    for index in range(steps):
        loss = train_step(*next_batch(), False)
        if profile and (index + 1) % 10 == 0:  # per 10 steps: wall time and who used the CPU
            loss.numpy()
            now, cpu = time.perf_counter(), _os_thread_cpu()
            used = {k: round(v - mark_cpu.get(k, 0.0), 3) for k, v in cpu.items()}
            windows.append({"s": round(now - mark, 3), "cpu": {k: v for k, v in used.items() if v}})
            mark, mark_cpu = now, cpu
    loss.numpy()
    elapsed = time.perf_counter() - started
    result = {"rank": hvd.rank(), "img_s": batch * steps / elapsed, "threads": _thread_cpu()}
    if profile:
        result["windows"] = windows
    harness.emit_result(result)


def _thread_cpu() -> Dict[str, float]:
    """CPU seconds of this process's Python threads other than the main one, by name (numbers
    stripped): where tf_otel's export, the SDK's batch processor, the coordinator... spent."""
    import re
    import threading

    out: Dict[str, float] = {}
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.ident is None:
            continue
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, AttributeError):
            continue
        name = re.sub(r"[-_ ]?\d+", "", thread.name)
        out[name] = round(out.get(name, 0.0) + seconds, 3)
    return out


def _os_thread_cpu() -> Dict[str, float]:
    """CPU seconds of every OS thread of this process (TF's pools, Horovod's background thread,
    gloo, tf_otel's threads), summed by thread name with numbers stripped."""
    import re

    tick = os.sysconf("SC_CLK_TCK")
    out: Dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = re.sub(r"[-_ ]?\d+", "", stat[stat.index("(") + 1 : stat.rindex(")")])
        fields = stat[stat.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


# -- in-process A/B (--inprocess): paired blocks in one job, for the 1 % goals on a busy VM -----

INPROCESS = (
    "untraced",
    "untraced_aa",  # untraced again: the A/A control of the paired blocks
    "steps_only",
    "coll_1in20",
    "coll_1in10",
    "coll_every",
    "coll_every_per_tensor",
)
# one step function for every mode: collective detail runs its twin (instrument/detail_twin.py), every
# other step the program's own graph; coll_1inN: detail on 1 sampled step in N (trace id), with
# the defaults' span shape for that N (children, fused groups); coll_every_per_tensor: every
# step, one span per tensor (TF_OTEL_HOROVOD_FUSED=0) against coll_every's groups
EVERY = {"coll_1in20": 20, "coll_1in10": 10, "coll_every": 1, "coll_every_per_tensor": 1}
MODES_INPROCESS = [m for m in os.environ.get("BENCH_INPROCESS_MODES", "").split(",") if m]


def pin_to_own_core() -> None:
    """This rank (and every thread it starts from now on) on one core of its own (the worker
    sets TensorFlow's pools to one thread each): ranks stop contending for each other's cores,
    as on a node with a core per rank; tf_otel's threads share the rank's core, so their cost
    still shows."""
    local = int(
        os.environ.get("HOROVOD_LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0))
    )
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[local % len(cores)]})


def worker_inprocess(
    model_name: str, batch: int, rounds: int, block: int, pin: bool, side: int
) -> None:
    """One job, modes switched per block on every rank in the same rotated order: the same
    processes, the same warm graphs (the program's and its detail twin) and machine load for
    all modes."""
    if pin:
        pin_to_own_core()
    import tf_otel

    tf_otel.instrument()
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    from tf_otel.instrument import cpu_pacer, detail_twin
    from tf_otel.instrument.horovod.collective_source import STAMPS, choice
    from tf_otel.instrument.horovod.stamps import (
        collector,
        exchange,
        fused_wanted,
        parts_wanted,
    )
    from tf_otel.otel import ids
    from tf_otel.runtime import lifecycle

    if pin:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    cls, default_side, _, _ = MODELS[model_name]
    side = side or default_side
    model = getattr(tf.keras.applications, cls)(weights=None, input_shape=(side, side, 3))
    optimizer = tf.keras.optimizers.SGD(0.01)
    images = tf.random.uniform([batch, side, side, 3], seed=1)
    labels = tf.random.uniform([batch, 1], minval=0, maxval=999, dtype=tf.int64, seed=2)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def train_step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    # the start-up is not measured here: prepare the twin at full speed
    cpu_pacer.FLOOR = cpu_pacer.CEILING = cpu_pacer.FALLBACK = 1.0
    collector.every = 1
    for _ in range(3):  # the twin: traced and run
        train_step()
    collector.every = 0
    for _ in range(3):  # the program's own trace
        train_step()
    # the twin is prepared off the training thread (instrument/detail_twin.py): blocks start once it
    # runs on every rank, so no block holds a detail step deferred for it
    assert detail_twin.wait_open(600), detail_twin.generations()
    assert choice.mode == STAMPS, choice.mode
    modes = [m for m in INPROCESS if m in MODES_INPROCESS] or list(INPROCESS)
    pipeline = lifecycle.get_pipeline()

    order: List[str] = []  # the modes' blocks in the order they ran
    cpu: List[float] = []  # the process's CPU seconds (every thread) as each block began

    def switch(mode: str) -> None:
        order.append(mode)
        cpu.append(_process_cpu_s())
        sampler = ALWAYS_OFF if mode.startswith("untraced") else ALWAYS_ON
        pipeline._sampler, pipeline._sample_fast = sampler, ids.fast_root_decision(sampler)
        collector.every = EVERY.get(mode, 0)
        exchange.parts = parts_wanted(None, collector.every)
        exchange.fused = fused_wanted(None, collector.every) and mode != "coll_every_per_tensor"

    # odd rounds reversed as well: the export backlog a mode leaves falls on other next modes
    times = harness.step_times(
        modes, rounds, block, switch, lambda: train_step().numpy(), reverse_odd=True
    )
    cpu.append(_process_cpu_s())
    block_cpu = [b - a for a, b in zip(cpu, cpu[1:])]
    harness.emit_result({"rank": hvd.rank(), "times": times, "order": order, "cpu": block_cpu})


def _process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_inprocess(args: argparse.Namespace) -> str:
    tmp = tempfile.mkdtemp(prefix="bench_real_ip_")
    env = harness.horovod_env(
        tmp,
        TF_USE_LEGACY_KERAS="1",
        TF_OTEL_HOROVOD_EVERY="1",  # timing ops built in the stamped function; switched per block
    )
    lines = []
    for model in args.models:
        argv = [__file__, "--worker", "--inprocess", f"--model={model}", f"--batch={args.batch}"]
        argv += [f"--rounds={args.rounds}", f"--block={args.block}"] + ["--pin"] * args.pin
        argv += [f"--side={args.side}"] * bool(args.side)
        load = os.getloadavg()[0]
        job = harness.launch(harness.horovodrun(args.np, argv), env, timeout=1200)
        results = job.results()
        if len(results) != args.np:
            print(f"{model}: failed rc={job.returncode}\n{job.stderr[-3000:]}", flush=True)
            continue
        if args.raw:
            with open(args.raw, "a") as raw:
                raw.write(
                    json.dumps({"model": model, "block": args.block, "ranks": results}) + "\n"
                )
        spans = _span_categories(Path(tmp))
        lines.append(
            f"\n{model}: one job, {args.rounds} rounds x {args.block} steps per mode, rotated; "
            f"load average {load:.1f}; spans written {dict(spans)}\n"
        )
        lines.append("| rank | " + " | ".join(INPROCESS) + " |")
        lines.append("|---|" + "---|" * len(INPROCESS))
        for r in sorted(results, key=lambda r: r["rank"]):
            first = "untraced" if "untraced" in r["times"] else next(iter(r["times"]))
            base = statistics.fmean(r["times"][first])
            cells = [
                f"{base / statistics.fmean(r['times'][m]):.3f}×" if m in r["times"] else "-"
                for m in INPROCESS
            ]
            lines.append(f"| {r['rank']} | " + " | ".join(cells) + " |")
        lines += paired_blocks(results, args.block)
        lines += bracketed_blocks(results, args.block)
        lines += bracketed_blocks(results, args.block, cpu=True)
    shutil.rmtree(tmp, ignore_errors=True)
    head = (
        "In-process A/B: throughput vs untraced (mean step time ratio; one step function; "
        "untraced = steps not sampled; steps_only = sampled, no collective detail; coll_1inN = "
        "collective detail (the function's twin) on 1 sampled step in N; coll_every = on every "
        "step, one span per group that completed together; coll_every_per_tensor = one span per "
        "tensor)"
    )
    return head + "\n" + "\n".join(lines)


def paired_blocks(results: List[dict], block: int) -> List[str]:
    """Each mode's blocks paired with the same round's untraced block (median step of each
    block, base / mode: a throughput ratio), per rank: the median over rounds and its 95 %
    confidence interval (order statistics); untraced_aa's is the resolution of the others."""
    lines = ["", "Paired blocks (throughput vs untraced, median of the rounds' ratios, 95 % CI):"]
    for r in sorted(results, key=lambda r: r["rank"]):
        times = r["times"]
        if "untraced" not in times:
            continue

        def blocks(mode: str, times: Dict[str, List[int]] = times) -> List[float]:
            ns = times[mode]
            return [statistics.median(ns[i : i + block]) for i in range(0, len(ns), block)]

        base = blocks("untraced")
        cells = []
        for mode in (m for m in INPROCESS if m in times and m != "untraced"):
            ratios = sorted(b / m for b, m in zip(base, blocks(mode)))
            cells.append(f"{mode} " + _median_ci(ratios))
        lines.append(f"rank {r['rank']}: " + "; ".join(cells))
    return lines


def bracketed_blocks(results: List[dict], block: int, cpu: bool = False) -> List[str]:
    """Each block of a mode against the untraced blocks that ran just before and just after it
    (interpolated to it; one side at either end of the job): a machine that slows or speeds up
    over minutes moves both sides alike, which pairing by round leaves in. A block's value: its
    median step, or (cpu) the CPU seconds its process used, every thread (what tf_otel's
    threads add shows there even when the step does not wait for them). Per rank, the trimmed
    mean of the blocks' ratios and its 95 % interval; untraced_aa's is the resolution."""
    what = "CPU seconds a block, every thread" if cpu else "median step"
    lines = [
        "",
        f"Bracketed blocks ({what}; untraced over the mode, vs the untraced blocks either side; "
        "20 % trimmed mean of the blocks' ratios, 95 % CI):",
    ]
    for r in sorted(results, key=lambda r: r["rank"]):
        times, order = r["times"], r.get("order")
        if "untraced" not in times or not order or (cpu and "cpu" not in r):
            continue
        seen: Counter = Counter()
        timeline = []  # (mode, the block's value), in the order the blocks ran
        for i, mode in enumerate(order):
            k = seen[mode]
            seen[mode] += 1
            steps = times[mode][k * block : (k + 1) * block]
            timeline.append((mode, r["cpu"][i] if cpu else statistics.median(steps)))
        cells = []
        for want in (m for m in INPROCESS if m in times and m != "untraced"):
            ratios = [
                base / value
                for i, (mode, value) in enumerate(timeline)
                if mode == want and (base := _untraced_around(timeline, i)) is not None
            ]
            cells.append(f"{want} " + _trimmed_mean_ci(ratios))
        lines.append(f"rank {r['rank']}: " + "; ".join(cells))
    return lines


def _untraced_around(timeline: List[tuple], i: int) -> Optional[float]:
    """The untraced blocks' values nearest before and after position i, interpolated to i by
    their distances (rotation puts them unevenly around a block; a plain mean would read a
    steady drift as a cost); the one side at either end of the job."""
    before = next((j for j in range(i - 1, -1, -1) if timeline[j][0] == "untraced"), None)
    after = next((j for j in range(i + 1, len(timeline)) if timeline[j][0] == "untraced"), None)
    if before is None or after is None:
        side = before if after is None else after
        return None if side is None else timeline[side][1]
    low, high = timeline[before][1], timeline[after][1]
    return low + (high - low) * (i - before) / (after - before)


def _trimmed_mean_ci(ratios: List[float], trim: float = 0.2) -> str:
    """'mean (low-high, n=N)': the trimmed mean of the log ratios (a stalled block on either
    side weighs nothing) and its 95 % interval from the winsorised variance (Tukey-McLaughlin),
    back as ratios. A mean: with normal-ish noise it needs fewer blocks than the median does."""
    logs = sorted(math.log(r) for r in ratios)
    n = len(logs)
    g = int(trim * n)
    if n - 2 * g < 3:
        return "-"
    kept = logs[g : n - g]
    winsorised = [kept[0]] * g + kept + [kept[-1]] * g
    se = statistics.stdev(winsorised) / ((1 - 2 * trim) * n**0.5)
    t = 1.96 + 2.4 / (len(kept) - 1)  # Student's t at 97.5 %, near enough from 5 degrees on
    mean = statistics.fmean(kept)
    low, high = math.exp(mean - t * se), math.exp(mean + t * se)
    return f"{math.exp(mean):.4f}× ({low:.4f}-{high:.4f}, n={n})"


def _median_ci(ratios: List[float]) -> str:
    """'median (low-high, n=N)': the 95 % interval of the median by order statistics."""
    n = len(ratios)
    if not n:
        return "-"
    half = 0.98 * n**0.5  # 1.96 * sqrt(n) / 2 ranks either side of the median
    low, high = ratios[max(0, int(n / 2 - half))], ratios[min(n - 1, int(n / 2 + half))]
    return f"{statistics.median(ratios):.4f}× ({low:.4f}-{high:.4f}, n={n})"


# -- driver -----------------------------------------------------------------------------------


METRICS_ENDPOINT = ""
TRACE_SINK: Optional[TraceSink] = None


class TraceSink:
    """An OTLP/gRPC trace endpoint that only keeps each request's bytes; they are decoded (to
    count spans) after the job, so while the ranks train this process only receives (its gRPC
    threads still share the machine's cores, as a collector on the same host would)."""

    def __init__(self) -> None:
        self.port = 0
        self._requests: List[bytes] = []
        self._server: Any = None

    def start(self) -> TraceSink:
        from concurrent import futures

        import grpc

        def export(request: bytes, context: Any) -> bytes:
            self._requests.append(request)  # list.append: atomic under the GIL
            return b""  # an empty ExportTraceServiceResponse

        # no (de)serializers: the handler gets and returns raw bytes
        handler = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService",
            {"Export": grpc.unary_unary_rpc_method_handler(export)},
        )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)

    def take_categories(self) -> Counter:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        requests, self._requests = self._requests, []
        counts: Counter = Counter()
        for raw in requests:
            request = trace_service_pb2.ExportTraceServiceRequest.FromString(raw)
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        for attr in span.attributes:
                            if attr.key == "tf_otel.category":
                                counts[attr.value.string_value] += 1
        return counts


def run_once(mode: str, model: str, args: argparse.Namespace) -> Optional[dict]:
    tmp = tempfile.mkdtemp(prefix="bench_real_")
    if TRACE_SINK is not None:
        TRACE_SINK.take_categories()  # what a timed-out job's ranks sent late is not this run's
    # spans go to tmp/spans-{rank}.jsonl (really built and written)
    env = harness.horovod_env(tmp, TF_USE_LEGACY_KERAS="1")
    env.pop("HOROVOD_TIMELINE", None)  # only the hvd_timeline mode sets it
    if METRICS_ENDPOINT:  # metrics are on by default: they go to a real OTLP receiver
        env.update(
            OTEL_METRICS_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=METRICS_ENDPOINT,
            OTEL_EXPORTER_OTLP_METRICS_PROTOCOL="grpc",
            OTEL_EXPORTER_OTLP_METRICS_INSECURE="true",
        )
    env.update({k: v.format(tmp=tmp) for k, v in MODES[mode].items()})
    if env.pop("BENCH_OTLP", None) and TRACE_SINK is not None:
        env.pop("TF_OTEL_FILE")
        env.update(
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"http://127.0.0.1:{TRACE_SINK.port}",
            OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="grpc",
            OTEL_EXPORTER_OTLP_TRACES_INSECURE="true",
        )
    if args.profile:
        env["BENCH_PROFILE"] = "1"
    argv = [__file__, "--worker", f"--model={model}", f"--batch={args.batch}"]
    argv += [f"--warmup={args.warmup}", f"--steps={timed_steps(model, args, mode)}"]
    load = os.getloadavg()[0]
    started = time.monotonic()
    try:
        job = harness.launch(harness.horovodrun(args.np, argv), env, timeout=600)
    except subprocess.TimeoutExpired:
        print(f"  {mode} {model}: timed out", flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    results = job.results()
    categories = _span_categories(Path(tmp))
    if TRACE_SINK is not None:
        categories += TRACE_SINK.take_categories()
    detail = _detail_steps(Path(tmp))
    timeline_mb = sum(p.stat().st_size for p in Path(tmp).glob("horovod_timeline*")) / 1e6
    shutil.rmtree(tmp, ignore_errors=True)
    if len(results) != args.np:
        print(f"  {mode} {model}: failed rc={job.returncode}\n{job.stderr[-2000:]}", flush=True)
        return None
    img_s = statistics.mean(r["img_s"] for r in results)
    row = {
        "mode": mode,
        "model": model,
        "img_s": img_s,
        "per_rank": [round(r["img_s"], 2) for r in sorted(results, key=lambda r: r["rank"])],
        "threads": [r.get("threads", {}) for r in sorted(results, key=lambda r: r["rank"])],
        "load": load,
        "wall_s": time.monotonic() - started,
        "spans": dict(categories),
        "detail": detail,
        "timeline_mb": timeline_mb,
        "windows": [r.get("windows", []) for r in sorted(results, key=lambda r: r["rank"])],
    }
    shown = "; ".join(f"{k} steps {v}" for k, v in detail.items())
    busiest = [
        ", ".join(f"{n} {v:.1f}" for n, v in sorted(t.items(), key=lambda kv: -kv[1])[:3])
        for t in row["threads"]
    ]
    if any(busiest):
        shown += ("; " if shown else "") + "thread CPU s " + " | ".join(busiest)
    print(
        f"  {model:16s} {mode:13s} {img_s:6.2f} img/s/rank  load {load:4.1f}  "
        f"{row['wall_s']:4.0f} s  spans {dict(categories)}" + (f"  [{shown}]" if shown else ""),
        flush=True,
    )
    return row


def timed_steps(model: str, args: argparse.Namespace, mode: str = "") -> int:
    _, _, steps, quick_steps = MODELS[model]
    chosen = args.steps or (quick_steps if args.quick else steps)
    return max(chosen, MODE_MIN_STEPS.get(mode, 0))


def estimate_s(model: str, mode: str, args: argparse.Namespace) -> float:
    """One job's wall time, before any was measured."""
    return START_S + (1 + args.warmup + timed_steps(model, args, mode)) * STEP_S[model]


def _detail_steps(tmp: Path) -> Dict[str, str]:
    """Which steps got op / collective detail, per rank: the same steps on every rank, and
    op detail on step 100 inside the timed window (steps warmup+1 ...)."""
    steps: Dict[str, Dict[int, set]] = {"ops": {}, "collectives": {}}
    for span in harness.written_spans(tmp):
        attrs = {a["key"]: a.get("value", {}) for a in span.get("attributes", [])}
        category = attrs.get("tf_otel.category", {}).get("stringValue")
        kind = {"compute": "ops", "collective": "collectives"}.get(category or "")
        if kind is None:
            continue
        rank = int(attrs.get("tf_otel.rank", {}).get("intValue", -1))
        step = int(attrs.get("tf_otel.step", {}).get("intValue", -1))
        steps[kind].setdefault(rank, set()).add(step)
    out = {}
    for kind, per_rank in steps.items():
        if not per_rank:
            continue
        lists = {rank: sorted(s) for rank, s in sorted(per_rank.items())}
        same = len({tuple(v) for v in lists.values()}) == 1
        first = next(iter(lists.values()))
        if same:
            text = f"{first if len(first) <= 6 else f'{len(first)} steps'} on every rank"
        else:
            text = ", ".join(f"rank {r}: {v if len(v) <= 6 else len(v)}" for r, v in lists.items())
        out[kind] = text + ("" if same else " (DIFFER)")
    return out


def _span_categories(tmp: Path) -> Counter:
    counts: Counter = Counter()
    for span in harness.written_spans(tmp):
        for attr in span.get("attributes", []):
            if attr.get("key") == "tf_otel.category":
                counts[attr["value"].get("stringValue", "?")] += 1
    return counts


def summarise(rows: List[dict], args: argparse.Namespace, loads: List[float]) -> str:
    lines = [
        "| model | mode | img/sec per rank (runs) | median vs untraced | goal | spans written |",
        "|---|---|---|---|---|---|",
    ]
    medians = {
        (r["model"], r["mode"]): statistics.median(
            x["img_s"] for x in rows if (x["model"], x["mode"]) == (r["model"], r["mode"])
        )
        for r in rows
    }
    for model in args.models:
        base_rows = [r["img_s"] for r in rows if r["model"] == model and r["mode"] == "untraced"]
        base = statistics.median(base_rows) if base_rows else None
        for mode in args.modes:
            mine = [r for r in rows if r["model"] == model and r["mode"] == mode]
            if not mine:
                continue
            values = [r["img_s"] for r in mine]
            ratio = f"**{statistics.median(values) / base:.3f}×**" if base else "n/a"
            pair = PAIRED.get(mode)
            if pair and (model, pair) in medians:
                ratio += f" ({statistics.median(values) / medians[(model, pair)]:.3f}× {pair})"
            goal = GOALS.get(mode)
            goal_text = f"≥ {goal:.2f}×" if goal else ""
            spans = Counter()
            for r in mine:
                spans.update(r["spans"])
            shown = ", ".join(f"{k} {v // len(mine)}" for k, v in sorted(spans.items()))
            if mode == "hvd_timeline":
                shown = f"timeline file {statistics.mean(r['timeline_mb'] for r in mine):.1f} MB"
            detail = mine[-1].get("detail") or {}
            if detail:
                shown += "; detail " + "; ".join(f"{k}: {v}" for k, v in detail.items())
            lines.append(
                f"| {model} | {mode} | {' / '.join(f'{v:.2f}' for v in values)} | {ratio} | "
                f"{goal_text} | {shown or '-'} |"
            )
    head = (
        f"{len(rows)} runs, {args.rounds} round(s), rotated order; batch {args.batch}, {args.np} ranks "
        f"(horovodrun --gloo), TF_USE_LEGACY_KERAS=1; load average (1 min) at run starts "
        f"{min(loads):.1f}–{max(loads):.1f} on {os.cpu_count()} cores"
        f"{'; --quick' if args.quick else ''}"
    )
    return head + "\n\n" + "\n".join(lines)


def write_doc(path: Path, text: str) -> None:
    """``text`` as the process-level runs' generated section of the doc at ``path``; the rest
    of the file (the in-process section too) stays. A new file starts with _DOC_INTRO."""
    if not path.exists():
        path.write_text(_DOC_INTRO)
    harness.write_generated(path, "bench_real_model", text, TITLE)


def write_inprocess_doc(path: Path, text: str) -> None:
    """``text`` as the in-process runs' (--inprocess) generated section of the doc at
    ``path``; the rest of the file (the process-level section too) stays."""
    if not path.exists():
        path.write_text(_DOC_INTRO)
    harness.write_generated(path, "bench_real_model_inprocess", text, TITLE)


TITLE = "tf_otel on real models: throughput"
_DOC_INTRO = f"""# {TITLE}

`bench/bench_real_model.py` (see its docstring for the modes). The script rewrites only its
generated sections (between their markers); the rest of the file is kept between runs.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--model", default="mobilenetv2")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="fewer timed steps per run")
    parser.add_argument("--np", type=int, default=2, help="ranks")
    parser.add_argument("--inprocess", action="store_true", help="paired blocks in one job")
    parser.add_argument("--block", type=int, default=8, help="--inprocess: steps per block")
    parser.add_argument(
        "--side", type=int, default=0, help="--inprocess: input side (0: the model's)"
    )
    parser.add_argument("--raw", metavar="JSONL", help="--inprocess: append each rank's step times")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="--inprocess: each rank on a core of its own, TF 1 thread",
    )
    parser.add_argument("--doc", default=str(DOC), help="the md file to write")
    parser.add_argument("--no-doc", action="store_true", help="do not write the md file")
    parser.add_argument(
        "--profile",
        metavar="JSON",
        help="also time every 10 steps and each OS thread's CPU in them; rows go to this file",
    )
    args = parser.parse_args()
    if args.worker and args.inprocess:
        worker_inprocess(args.model, args.batch, args.rounds, args.block, args.pin, args.side)
        return
    if args.worker:
        worker(args.model, args.batch, args.warmup, args.steps)
        return
    args.models = [m for m in args.models.split(",") if m]
    args.modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in args.models if m not in MODELS] + [m for m in args.modes if m not in MODES]
    if bad:
        sys.exit(f"unknown model/mode {bad}; models {list(MODELS)}, modes {list(MODES)}")
    if args.inprocess:
        table = run_inprocess(args)
        print(table)
        if not args.no_doc:
            write_inprocess_doc(Path(args.doc), table)
        return
    global METRICS_ENDPOINT, TRACE_SINK
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver().start()
    METRICS_ENDPOINT = f"http://{receiver.host}:{receiver.grpc_port}"
    if any(MODES[m].get("BENCH_OTLP") for m in args.modes):
        TRACE_SINK = TraceSink().start()
    runs = args.rounds * len(args.modes)
    guess = args.rounds * sum(estimate_s(m, mode, args) for m in args.models for mode in args.modes)
    longer = {m: timed_steps(args.models[0], args, m) for m in args.modes if m in MODE_MIN_STEPS}
    print(
        f"{runs * len(args.models)} runs ({args.rounds} rounds x {len(args.modes)} modes x "
        f"{len(args.models)} model(s)), {', '.join(f'{m} {timed_steps(m, args)} timed steps' for m in args.models)}"
        f"{f' ({longer} for these modes)' if longer else ''}; "
        f"estimated {guess / 60:.0f} min (job start ~{START_S:.0f} s + "
        f"{', '.join(f'{STEP_S[m]:.2f} s/step {m}' for m in args.models)}); load now "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )
    rows, loads = [], []
    started = time.monotonic()
    done = 0
    for round_no in range(args.rounds):
        order = harness.round_order(args.modes, round_no)
        print(f"round {round_no + 1}/{args.rounds}: {', '.join(order)}", flush=True)
        for model in args.models:
            for mode in order:
                loads.append(os.getloadavg()[0])
                row = run_once(mode, model, args)
                done += 1
                if row is not None:
                    rows.append(row)
        left = runs * len(args.models) - done
        if left:
            spent = time.monotonic() - started
            print(
                f"  {spent / 60:.1f} min so far, ~{spent / done * left / 60:.1f} min left",
                flush=True,
            )
    if TRACE_SINK is not None:
        TRACE_SINK.stop()
    if not rows:
        sys.exit("no run succeeded")
    if args.profile:
        Path(args.profile).write_text(json.dumps(rows, indent=1))
        print(f"profile rows: {args.profile}", flush=True)
    table = summarise(rows, args, loads)
    print("\n" + table)
    if not args.no_doc:
        command = " ".join(["bench/bench_real_model.py"] + sys.argv[1:])
        when = time.strftime("%Y-%m-%d %H:%M")
        write_doc(Path(args.doc), f"Last run: {when} UTC, `{command}`\n\n{table}")
        print(f"\nwrote {args.doc}")


if __name__ == "__main__":
    main()
