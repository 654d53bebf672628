"""Cost of tf_otel on real models: img/sec of a keras.applications model trained with Horovod's
DistributedGradientTape on synthetic data (what Horovod's tensorflow2_synthetic_benchmark does,
written here: the PyPI sdist does not ship Horovod's examples), 2 CPU ranks, gloo, tf_keras.

One ``horovodrun -np 2 --gloo`` job per (mode, model, round); the modes of a round run in a
rotated order, so slow and fast windows of a shared machine fall on every mode. Modes:

  untraced      no tf_otel
  defaults      TF_OTEL_ENABLED=1 (zero-code defaults, always-on sampler)
  steps_only    TF_OTEL_HOROVOD=0: step spans only
  coll_every    collective detail on every step (TF_OTEL_HOROVOD_EVERY=1)
  coll_1in100   collective detail on 1 step in 100 (TF_OTEL_HOROVOD_EVERY=100)
  ops_100       op detail every 100th step (TF_OTEL_OPS_EVERY=100)
  hvd_timeline  Horovod's own HOROVOD_TIMELINE=<file>, no tf_otel (the anchor)

Spans are really built and written (TF_OTEL_FILE, OTLP-JSON); the table counts them per
category so a mode that silently recorded nothing shows. Prints the ratio table with the load
average and writes docs/BENCHMARKS_real_model.md.

    .venv/bin/python bench/bench_real_model.py                 # 3 rounds, both models
    .venv/bin/python bench/bench_real_model.py --rounds 1 --quick
    .venv/bin/python bench/bench_real_model.py --modes untraced,defaults --models mobilenetv2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "BENCHMARKS_real_model.md"

MODES: Dict[str, Dict[str, str]] = {
    "untraced": {},
    "defaults": {"TF_OTEL_ENABLED": "1"},
    "steps_only": {"TF_OTEL_ENABLED": "1", "TF_OTEL_HOROVOD": "0"},
    "coll_every": {"TF_OTEL_ENABLED": "1", "TF_OTEL_HOROVOD_EVERY": "1"},
    "coll_1in100": {"TF_OTEL_ENABLED": "1", "TF_OTEL_HOROVOD_EVERY": "100"},
    "ops_100": {"TF_OTEL_ENABLED": "1", "TF_OTEL_OPS_EVERY": "100"},
    "hvd_timeline": {"HOROVOD_TIMELINE": "{tmp}/horovod_timeline.json"},
}
GOALS = {
    "defaults": 0.99,
    "steps_only": None,
    "coll_every": 0.90,
    "coll_1in100": 0.99,
    "ops_100": 0.98,
}
# name -> (keras.applications class, input side, timed steps, quick timed steps)
MODELS = {
    "mobilenetv2": ("MobileNetV2", 224, 40, 16),
    "mobilenetv3small": ("MobileNetV3Small", 128, 100, 40),
}


# -- worker (one rank) ------------------------------------------------------------------------


def worker(model_name: str, batch: int, warmup: int, steps: int) -> None:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    cls, side, _, _ = MODELS[model_name]
    model = getattr(tf.keras.applications, cls)(weights=None, input_shape=(side, side, 3))
    optimizer = tf.keras.optimizers.SGD(0.01 * hvd.size())
    images = tf.random.uniform([batch, side, side, 3], seed=1)
    labels = tf.random.uniform([batch, 1], minval=0, maxval=999, dtype=tf.int64, seed=2)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()

    @tf.function
    def train_step(first_batch: bool) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:  # same start on every rank
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        return loss

    train_step(True)
    for _ in range(warmup):
        train_step(False)
    started = time.perf_counter()
    for _ in range(steps):
        loss = train_step(False)
    loss.numpy()
    elapsed = time.perf_counter() - started
    result = {"rank": hvd.rank(), "img_s": batch * steps / elapsed}
    print("RESULT " + json.dumps(result), flush=True)


# -- in-process A/B (--inprocess): paired blocks in one job, for the 1 % goals on a busy VM -----

INPROCESS = ("untraced", "steps_only", "stamps_idle", "coll_every", "defaults")
MODES_INPROCESS = [m for m in os.environ.get("BENCH_INPROCESS_MODES", "").split(",") if m]


def worker_inprocess(model_name: str, batch: int, rounds: int, block: int) -> None:
    """One job, modes switched per block on every rank in the same rotated order: the same
    processes, warm graph and machine load for all modes. Two step functions: one built without
    collective stamps (untraced, steps_only), one with (the rest)."""
    import tf_otel

    tf_otel.instrument()
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    from tf_otel.instrument import horovod as hvd_hook
    from tf_otel.instrument.horovod_stamps import collector
    from tf_otel.pipeline import ids, lifecycle

    hvd.init()
    cls, side, _, _ = MODELS[model_name]
    model = getattr(tf.keras.applications, cls)(weights=None, input_shape=(side, side, 3))
    optimizer = tf.keras.optimizers.SGD(0.01)
    images = tf.random.uniform([batch, side, side, 3], seed=1)
    labels = tf.random.uniform([batch, 1], minval=0, maxval=999, dtype=tf.int64, seed=2)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()

    def body() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    plain, stamped = tf.function(body), tf.function(body)
    enabled = collector.enabled
    collector.enabled = lambda: False
    for _ in range(3):
        plain()
    collector.enabled = enabled
    for _ in range(3):
        stamped()
    assert hvd_hook.hook.mode == hvd_hook.STAMPS, hvd_hook.hook.mode
    pipeline = lifecycle.get_pipeline()
    modes = [m for m in INPROCESS if m in MODES_INPROCESS] or list(INPROCESS)
    times: Dict[str, List[int]] = {m: [] for m in modes}
    for round_no in range(rounds):
        shift = round_no % len(modes)
        order = modes[shift:] + modes[:shift]
        # odd rounds reversed: the export backlog a mode leaves falls on different next modes
        for mode in order[::-1] if round_no % 2 else order:
            sampler = ALWAYS_OFF if mode == "untraced" else ALWAYS_ON
            pipeline._sampler, pipeline._sample_fast = sampler, ids.fast_root_decision(sampler)
            collector.every = {"coll_every": 1, "defaults": 50}.get(mode, 0)
            step = plain if mode in ("untraced", "steps_only") else stamped
            for _ in range(block):
                t0 = time.perf_counter_ns()
                step().numpy()
                times[mode].append(time.perf_counter_ns() - t0)
    print("RESULT " + json.dumps({"rank": hvd.rank(), "times": times}), flush=True)


def run_inprocess(args: argparse.Namespace) -> str:
    venv = Path(sys.executable).parent
    tmp = tempfile.mkdtemp(prefix="bench_real_ip_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TF_OTEL_"))}
    env.update(
        PATH=f"{venv}{os.pathsep}{env.get('PATH', '')}",
        TF_CPP_MIN_LOG_LEVEL="2",
        TF_USE_LEGACY_KERAS="1",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OTEL_TRACES_EXPORTER="none",
        TF_OTEL_FILE=os.path.join(tmp, "spans-{rank}.jsonl"),
        TMPDIR=tmp,
        TF_OTEL_HOROVOD_EVERY="1",  # timing ops built in the stamped function; switched per block
    )
    lines = []
    for model in args.models:
        command = [str(venv / "horovodrun"), "-np", str(args.np), "-H", f"localhost:{args.np}"]
        command += ["--gloo", sys.executable, __file__, "--worker", "--inprocess"]
        command += [f"--model={model}", f"--batch={args.batch}", f"--rounds={args.rounds}"]
        command += [f"--block={args.block}"]
        load = os.getloadavg()[0]
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
        results = [
            json.loads(line.split("RESULT ", 1)[1])
            for line in out.stdout.splitlines()
            if "RESULT " in line
        ]
        if len(results) != args.np:
            print(f"{model}: failed rc={out.returncode}\n{out.stderr[-3000:]}", flush=True)
            continue
        spans = _span_categories(Path(tmp))
        lines.append(
            f"\n{model}: one job, {args.rounds} rounds x {args.block} steps per mode, rotated; "
            f"load average {load:.1f}; spans written {dict(spans)}\n"
        )
        lines.append("| rank | " + " | ".join(INPROCESS) + " |")
        lines.append("|---|" + "---|" * len(INPROCESS))
        for r in sorted(results, key=lambda r: r["rank"]):
            first = "untraced" if "untraced" in r["times"] else next(iter(r["times"]))
            base = statistics.median(r["times"][first])
            cells = [
                f"{base / statistics.median(r['times'][m]):.3f}×" if m in r["times"] else "-"
                for m in INPROCESS
            ]
            lines.append(f"| {r['rank']} | " + " | ".join(cells) + " |")
    shutil.rmtree(tmp, ignore_errors=True)
    head = (
        "In-process A/B: throughput vs untraced (median step time ratio; untraced = the same "
        "step function built without stamps, steps not sampled; stamps_idle = stamped graph, "
        "sampled, no detail; defaults = detail 1 step in 50)"
    )
    return head + "\n" + "\n".join(lines)


# -- driver -----------------------------------------------------------------------------------


def run_once(mode: str, model: str, args: argparse.Namespace) -> Optional[dict]:
    venv = Path(sys.executable).parent
    tmp = tempfile.mkdtemp(prefix="bench_real_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TF_OTEL_"))}
    env.pop("HOROVOD_TIMELINE", None)
    env.update(
        PATH=f"{venv}{os.pathsep}{env.get('PATH', '')}",
        TF_CPP_MIN_LOG_LEVEL="2",
        TF_USE_LEGACY_KERAS="1",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OTEL_TRACES_EXPORTER="none",  # spans go to the file below (really built and written)
        TF_OTEL_FILE=os.path.join(tmp, "spans-{rank}.jsonl"),
        TMPDIR=tmp,
    )
    env.update({k: v.format(tmp=tmp) for k, v in MODES[mode].items()})
    _, _, steps, quick_steps = MODELS[model]
    command = [
        str(venv / "horovodrun"),
        "-np",
        str(args.np),
        "-H",
        f"localhost:{args.np}",
        "--gloo",
        sys.executable,
        __file__,
        "--worker",
        f"--model={model}",
        f"--batch={args.batch}",
        f"--warmup={args.warmup}",
        f"--steps={quick_steps if args.quick else steps}",
    ]
    load = os.getloadavg()[0]
    started = time.monotonic()
    try:
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        print(f"  {mode} {model}: timed out", flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    results = [
        json.loads(line.split("RESULT ", 1)[1])
        for line in out.stdout.splitlines()
        if "RESULT " in line
    ]
    categories = _span_categories(Path(tmp))
    timeline_mb = sum(p.stat().st_size for p in Path(tmp).glob("horovod_timeline*")) / 1e6
    shutil.rmtree(tmp, ignore_errors=True)
    if len(results) != args.np:
        print(f"  {mode} {model}: failed rc={out.returncode}\n{out.stderr[-2000:]}", flush=True)
        return None
    img_s = statistics.mean(r["img_s"] for r in results)
    row = {
        "mode": mode,
        "model": model,
        "img_s": img_s,
        "per_rank": [round(r["img_s"], 2) for r in sorted(results, key=lambda r: r["rank"])],
        "load": load,
        "wall_s": time.monotonic() - started,
        "spans": dict(categories),
        "timeline_mb": timeline_mb,
    }
    print(
        f"  {model:16s} {mode:12s} {img_s:6.2f} img/s/rank  load {load:4.1f}  "
        f"{row['wall_s']:4.0f} s  spans {dict(categories)}",
        flush=True,
    )
    return row


def _span_categories(tmp: Path) -> Counter:
    counts: Counter = Counter()
    for path in tmp.glob("spans-*.jsonl"):
        with open(path) as f:
            for line in f:
                try:
                    data = json.loads(line)
                except ValueError:
                    continue
                for rs in data.get("resourceSpans", []):
                    for ss in rs.get("scopeSpans", []):
                        for span in ss.get("spans", []):
                            for attr in span.get("attributes", []):
                                if attr.get("key") == "tf_otel.category":
                                    counts[attr["value"].get("stringValue", "?")] += 1
    return counts


def summarise(rows: List[dict], args: argparse.Namespace, loads: List[float]) -> str:
    lines = [
        "| model | mode | img/sec per rank (runs) | median vs untraced | goal | spans written |",
        "|---|---|---|---|---|---|",
    ]
    for model in args.models:
        base_rows = [r["img_s"] for r in rows if r["model"] == model and r["mode"] == "untraced"]
        base = statistics.median(base_rows) if base_rows else None
        for mode in args.modes:
            mine = [r for r in rows if r["model"] == model and r["mode"] == mode]
            if not mine:
                continue
            values = [r["img_s"] for r in mine]
            ratio = f"**{statistics.median(values) / base:.3f}×**" if base else "n/a"
            goal = GOALS.get(mode)
            goal_text = f"≥ {goal:.2f}×" if goal else ""
            spans = Counter()
            for r in mine:
                spans.update(r["spans"])
            shown = ", ".join(f"{k} {v // len(mine)}" for k, v in sorted(spans.items()))
            if mode == "hvd_timeline":
                shown = f"timeline file {statistics.mean(r['timeline_mb'] for r in mine):.1f} MB"
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


def write_doc(table: str, args: argparse.Namespace) -> None:
    command = " ".join(["bench/bench_real_model.py"] + sys.argv[1:])
    doc = Path(args.doc)
    old = doc.read_text() if doc.exists() else _DOC_INTRO
    intro = old.split("<!-- table -->")[0]
    kept = old.split("<!-- inprocess -->", 1)[1] if "<!-- inprocess -->" in old else ""
    doc.write_text(
        intro
        + "<!-- table -->\n"
        + f"Last run: {time.strftime('%Y-%m-%d %H:%M')} UTC, `{command}`\n\n"
        + table
        + "\n"
        + (f"\n<!-- inprocess -->{kept}" if kept else "")
    )


_DOC_INTRO = """# tf_otel on real models: throughput

`bench/bench_real_model.py` (see its docstring for the modes). Written by the script; the text
above the table marker is kept between runs.

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
    parser.add_argument("--doc", default=str(DOC), help="the md file to write")
    parser.add_argument("--no-doc", action="store_true", help="do not write the md file")
    args = parser.parse_args()
    if args.worker and args.inprocess:
        worker_inprocess(args.model, args.batch, args.rounds, args.block)
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
            doc = Path(args.doc)
            text = doc.read_text() if doc.exists() else _DOC_INTRO + "<!-- table -->\n"
            marker = "<!-- inprocess -->"
            doc.write_text(text.split(marker)[0].rstrip() + f"\n\n{marker}\n{table}\n")
        return
    rows, loads = [], []
    for round_no in range(args.rounds):
        shift = round_no % len(args.modes)
        order = args.modes[shift:] + args.modes[:shift]
        print(f"round {round_no + 1}/{args.rounds}: {', '.join(order)}", flush=True)
        for model in args.models:
            for mode in order:
                loads.append(os.getloadavg()[0])
                row = run_once(mode, model, args)
                if row is not None:
                    rows.append(row)
    if not rows:
        sys.exit("no run succeeded")
    table = summarise(rows, args, loads)
    print("\n" + table)
    if not args.no_doc:
        write_doc(table, args)
        print(f"\nwrote {args.doc}")


if __name__ == "__main__":
    main()
