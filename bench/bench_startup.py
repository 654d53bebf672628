"""Start-up and the first steps of real models, untraced vs tf_otel's defaults (issue 45).

What a new user sees first: Horovod's ``tensorflow2_synthetic_benchmark.py`` loop (written here:
the PyPI sdist ships no examples), a ``keras.applications`` model with weights=None, synthetic
data, DistributedGradientTape, 2 CPU ranks, gloo, tf_keras: step 0 is the ``first_batch=True``
call (the program's first trace), then ``--warmup`` batches (the second trace, ``first_batch=
False``), then ``--iters`` iterations of ``--per-iter`` batches, each timed as the benchmark
times them (img/sec). One ``horovodrun`` job per (model, mode, round); the modes of a round run
in a rotated order, so slow and fast minutes of a shared machine fall on every mode. Modes:

  untraced      no tf_otel
  untraced_aa   no tf_otel again: the A/A control (its ratios to untraced are the run's noise)
  untraced_noag no tf_otel, Horovod's per-gradient conds marked not for AutoGraph, as tf_otel's
                stand-ins for them are: the control for tf_otel's own start-up (AutoGraph's
                conversion of them costs MobileNetV2's trace ~8 s on this machine)
  defaults      TF_OTEL_ENABLED=1: the detail twin prepared off the training thread
  twin_on_step  defaults with TF_OTEL_TWIN_PREPARE=step: the twin traced and instantiated on
                the step that traced the program's function (what defaults did before issue 45,
                less its warm step)
  no_twin       defaults with TF_OTEL_HOROVOD_EVERY=0: no collective detail, so no twin to
                prepare (what the rest of the defaults cost in the same steps)

Per job (rank 0's steps; every rank's end is within a step of it):

- ``first steady``: seconds from the launch (this bench starting horovodrun) to the end of the
  first step whose duration is within 1.5x the job's steady median (the median of its last
  half of steps);
- ``worst iter``: the slowest timed iteration's img/sec over the untraced median of the same
  model (the issue's first timed iteration read 0.33x);
- ``steady``: the median img/sec of the timed iterations;
- tf_otel's own counters at the end (twin steps deferred, twins instantiated).

    .venv/bin/python bench/bench_startup.py                       # 3 rounds, both models
    .venv/bin/python bench/bench_startup.py --rounds 5 --doc      # and docs/benchmarks/startup.md
    .venv/bin/python bench/bench_startup.py --models mobilenetv2 --modes untraced,defaults
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import harness

DOC = harness.RESULTS / "startup.md"
MODES: Dict[str, Dict[str, str]] = {
    "untraced": {},
    "untraced_aa": {},
    "untraced_noag": {"BENCH_HVD_NO_AUTOGRAPH": "1"},
    "defaults": {"TF_OTEL_ENABLED": "1"},
    "twin_on_step": {"TF_OTEL_ENABLED": "1", "TF_OTEL_TWIN_PREPARE": "step"},
    # the defaults without collective detail: no twin is prepared (what the rest costs)
    "no_twin": {"TF_OTEL_ENABLED": "1", "TF_OTEL_HOROVOD_EVERY": "0"},
}
# name -> (keras.applications class, input side)
MODELS = {"mobilenetv2": ("MobileNetV2", 224), "efficientnetb0": ("EfficientNetB0", 160)}
STEADY = 1.5  # a step within 1.5x the steady median is steady


# -- worker (one rank) ------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    launched = int(os.environ["BENCH_LAUNCH_NS"])
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    if os.environ.get("BENCH_HVD_NO_AUTOGRAPH"):
        for name in ("_allreduce_cond", "_grouped_allreduce_cond"):
            setattr(hvd, name, tf.autograph.experimental.do_not_convert(getattr(hvd, name)))
    cls, side = MODELS[args.model]
    model = getattr(tf.keras.applications, cls)(weights=None, input_shape=(side, side, 3))
    opt = tf.optimizers.SGD(0.01)
    data = tf.random.uniform([args.batch, side, side, 3])
    target = tf.random.uniform([args.batch, 1], minval=0, maxval=999, dtype=tf.int64)

    @tf.function
    def benchmark_step(first_batch: bool) -> None:
        with tf.GradientTape() as tape:
            probs = model(data, training=True)
            loss = tf.losses.sparse_categorical_crossentropy(target, probs)
        tape = hvd.DistributedGradientTape(tape)
        gradients = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(gradients, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)

    ends: List[float] = []  # seconds from the launch to each step's end
    durations: List[float] = []
    opened: List[int] = []  # the first step after which every twin queued so far was open

    def step(first: bool) -> None:
        t0 = time.perf_counter()
        benchmark_step(first_batch=first)
        durations.append(time.perf_counter() - t0)
        ends.append((time.time_ns() - launched) / 1e9)
        if not opened and "tf_otel.instrument.detail_twin" in sys.modules:
            queued, _, open_ = sys.modules["tf_otel.instrument.detail_twin"].generations()
            if queued >= 2 and open_ >= queued:  # both traces (first_batch True, False)
                opened.append(len(durations) - 1)

    ready = (time.time_ns() - launched) / 1e9
    with tf.device("CPU"):  # as Horovod's benchmark runs its steps
        step(True)
        for _ in range(args.warmup):
            step(False)
        for _ in range(args.iters * args.per_iter):
            step(False)
    counters: Dict[str, Any] = {}
    if "tf_otel" in sys.modules:
        from tf_otel import health
        from tf_otel.instrument import detail_twin

        counters = {k: v for k, v in health.counters.items() if k.startswith(("twin", "error"))}
        # generations of the twin (one per trace of the step function) by the job's end
        queued, prepared, _ = detail_twin.generations()
        if queued:
            counters["twin_prepared"] = f"{prepared}/{queued}"
            counters["twin_thread_cpu_s"] = twin_thread_cpu_s(detail_twin)
        if opened:
            counters["twin_open_after_step"] = opened[0]
    harness.emit_result(
        {
            "rank": hvd.rank(),
            "ready_s": round(ready, 3),
            "ends": [round(x, 4) for x in ends],
            "durations": [round(x, 5) for x in durations],
            "counters": counters,
        }
    )


def twin_thread_cpu_s(detail_twin: Any) -> float:
    """CPU seconds the twin's preparation thread used so far (its trace, paced; psutil's
    per-thread times by the thread's id)."""
    import psutil

    thread = detail_twin._gate.thread
    if thread is None:
        return 0.0
    for t in psutil.Process().threads():
        if t.id == thread.native_id:
            return round(t.user_time + t.system_time, 2)
    return 0.0


# -- one job ----------------------------------------------------------------------------------


def first_steady(durations: List[float], ends: List[float]) -> Dict[str, float]:
    steady = statistics.median(durations[len(durations) // 2 :])
    first = next(i for i, d in enumerate(durations) if d <= STEADY * steady)
    return {"steady_step_s": steady, "first_steady_step": first, "first_steady_s": ends[first]}


def iterations(durations: List[float], args: argparse.Namespace) -> List[float]:
    """img/sec of each timed iteration, as the benchmark prints them."""
    timed = durations[1 + args.warmup :]
    return [
        args.batch * args.per_iter / sum(timed[i : i + args.per_iter])
        for i in range(0, args.iters * args.per_iter, args.per_iter)
    ]


def run_once(model: str, mode: str, args: argparse.Namespace) -> Optional[dict]:
    tmp = tempfile.mkdtemp(prefix="bench_startup_")
    env = harness.horovod_env(tmp, TF_USE_LEGACY_KERAS="1", OTEL_METRICS_EXPORTER="none")
    env.update(MODES[mode])
    argv = [__file__, "--worker", f"--model={model}", f"--batch={args.batch}"]
    argv += [f"--warmup={args.warmup}", f"--iters={args.iters}", f"--per-iter={args.per_iter}"]
    load = os.getloadavg()[0]
    env["BENCH_LAUNCH_NS"] = str(time.time_ns())
    job = harness.launch(harness.horovodrun(2, argv), env, timeout=900)
    shutil.rmtree(tmp, ignore_errors=True)
    results = sorted(job.results(), key=lambda r: r["rank"])
    if len(results) != 2:
        print(f"  {model} {mode}: failed rc={job.returncode}\n{job.stderr[-2000:]}", flush=True)
        return None
    rank0 = results[0]
    row: Dict[str, Any] = {"model": model, "mode": mode, "load": load, "wall_s": job.wall_s}
    row.update(first_steady(rank0["durations"], rank0["ends"]))
    row["iters"] = iterations(rank0["durations"], args)
    row["steady_img_s"] = statistics.median(row["iters"])
    row["ready_s"] = rank0["ready_s"]
    row["first_steps_s"] = [round(d, 2) for d in rank0["durations"][: 4 + args.warmup]]
    row["counters"] = rank0["counters"]
    print(
        f"  {model:15s} {mode:13s} first steady step {row['first_steady_step']:2d} at "
        f"{row['first_steady_s']:6.1f} s  steady {row['steady_img_s']:5.2f} img/s  iters "
        f"{' '.join(f'{x:.1f}' for x in row['iters'])}  first steps {row['first_steps_s']}  "
        f"load {load:.1f}  {row['counters'] or ''}",
        flush=True,
    )
    return row


# -- summary ----------------------------------------------------------------------------------


def summarise(rows: List[dict], args: argparse.Namespace, loads: List[float]) -> str:
    lines = [
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.rounds} interleaved "
        f"rounds, batch {args.batch}, {args.warmup} warm-up batches, {args.iters} iterations of "
        f"{args.per_iter} batches, 2 CPU ranks (gloo, tf_keras), load average "
        f"{min(loads):.1f}-{max(loads):.1f}",
        "",
        f"| model | mode | launch -> first steady step, s (per round) | vs {args.base} (paired, "
        f"median) | worst iteration / {args.base} median | steady img/s | vs {args.base} |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in args.models:
        base = [r for r in rows if r["model"] == model and r["mode"] == args.base]
        if not base:
            continue
        base_iter = statistics.median(x for r in base for x in r["iters"])
        base_steady = statistics.median(r["steady_img_s"] for r in base)
        for mode in args.modes:
            got = [r for r in rows if r["model"] == model and r["mode"] == mode]
            if not got:
                continue
            starts = [r["first_steady_s"] for r in got]
            paired = [
                r["first_steady_s"] / b["first_steady_s"]
                for r in got
                for b in base
                if b["round"] == r["round"]
            ]
            worst = min(x for r in got for x in r["iters"]) / base_iter
            steady = statistics.median(r["steady_img_s"] for r in got)
            lines.append(
                f"| {model} | {mode} | {' '.join(f'{s:.1f}' for s in starts)} | "
                f"{statistics.median(paired):.3f}x | {worst:.2f}x | {steady:.2f} | "
                f"{steady / base_steady:.3f}x |"
            )
    lines += ["", "Per job (rank 0): the first steps' seconds, tf_otel's twin counters:", ""]
    for r in rows:
        lines.append(
            f"    round {r['round']} {r['model']:15s} {r['mode']:13s} steps {r['first_steps_s']}"
            f" first steady {r['first_steady_step']} at {r['first_steady_s']:.1f} s, iters "
            f"{' '.join(f'{x:.1f}' for x in r['iters'])}, load {r['load']:.1f} "
            f"{json.dumps(r['counters']) if r['counters'] else ''}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--model", default="mobilenetv2")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--modes", default="untraced,defaults,twin_on_step,untraced_aa")
    parser.add_argument("--base", default="untraced", help="the mode the others are read against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--per-iter", type=int, default=5)
    parser.add_argument("--doc", action="store_true", help=f"write {DOC.name}'s section")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    args.models = [m for m in args.models.split(",") if m]
    args.modes = [m for m in args.modes.split(",") if m]
    rows: List[dict] = []
    loads: List[float] = []
    print(f"load {os.getloadavg()}", flush=True)
    for model in args.models:

        def one(round_no: int, mode: str, model: str = model) -> Optional[dict]:
            loads.append(os.getloadavg()[0])
            row = run_once(model, mode, args)
            if row is not None:
                row["round"] = round_no
                rows.append(row)
            return row

        harness.interleaved(args.modes, args.rounds, one)
    text = summarise(rows, args, loads or [os.getloadavg()[0]])
    print(text)
    if args.doc:
        write_doc(DOC, text)


def write_doc(path: Path, text: str) -> None:
    """``text`` as the generated section of the doc at ``path``; the rest of the file stays."""
    harness.write_generated(path, "bench_startup", text, "Start-up: launch to steady steps")


if __name__ == "__main__":
    main()
