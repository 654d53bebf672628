"""Cost of timing TensorFlow's own collectives (MultiWorkerMirroredStrategy's and
MirroredStrategy's all-reduces, tf_otel/instrument/tf_collectives.py) on a real model: the step
time of a Keras ``fit`` of MobileNetV2 (tf_keras, ``weights=None``, 96x96 synthetic images,
batch 8 per worker) under tf.distribute.MultiWorkerMirroredStrategy, 2 workers on 127.0.0.1
(TF_CONFIG, gRPC ring collectives on CPU), or with ``--strategy mirrored`` under
MirroredStrategy in one process over 2 logical CPU devices (batch 8 per replica, ring
collectives), with and without collective detail.

Collective detail runs the step function's twin (its timing ops) on 1 sampled step in
TF_OTEL_HOROVOD_EVERY (default 20, picked by the step's trace id, the same steps on every
worker); every other step runs the program's own graph. Modes, all TF_OTEL_ENABLED=1:

  off       TF_OTEL_HOROVOD=0: step spans, no collective timing (the baseline)
  default   the default policy: collective detail on 1 step in 20
  every     TF_OTEL_HOROVOD_EVERY=1: detail on every step (what one detail step costs)
  untraced  no tf_otel at all (not run unless named in --modes)
  default_floor  default with the twin's trace held at the pacer's floor (TF_OTEL_TWIN_CPU_FLOOR)
            however idle the cores: a diagnostic of what the trace's share costs the steps
  default_yield  default with the pacing thread letting go of the GIL every 256 Python
            events (a diagnostic: does the training thread wait for the trace's GIL?)

One 2-worker job per (mode, round); each round runs the modes in a rotated order, so slow and
fast windows of a shared machine fall on every mode, and each mode is judged by its per-round
ratio to ``off``. Every worker times each step in-process (wall clock between Keras'
on_train_batch_end calls, after the warm-up: the twin is traced on step 0 and first run on
step 1). A run's step time is the mean of its timed steps (throughput: 1 in 20 detail steps
included), its median as well (a typical step); the steps that got detail are read back from
the spans (TF_OTEL_FILE in a temporary directory; OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER
none). Prints the table and writes it into docs/benchmarks/tf_collectives.md (not with --quick
unless --doc is given; --no-doc: never), between the file's generated-section markers
(harness.write_generated: the hand-written rest of the file stays).

    .venv/bin/python bench/bench_tf_collectives.py                  # 5 rounds x 3 modes
    .venv/bin/python bench/bench_tf_collectives.py --quick          # smoke: 1 round, 8 steps
    .venv/bin/python bench/bench_tf_collectives.py --modes off,default --rounds 8
    .venv/bin/python bench/bench_tf_collectives.py --strategy mirrored   # docs/benchmarks/mirrored.md

The run time is estimated up front and again after each round.
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
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import harness

DOCS = {
    "mwms": harness.RESULTS / "tf_collectives.md",
    "mirrored": harness.RESULTS / "mirrored.md",
}
REPLICAS = 2  # --strategy mirrored: logical CPU devices in the one process

MODES: Dict[str, Dict[str, str]] = {
    "off": {"TF_OTEL_ENABLED": "1", "TF_OTEL_HOROVOD": "0"},
    "default": {"TF_OTEL_ENABLED": "1"},
    "every": {"TF_OTEL_ENABLED": "1", "TF_OTEL_HOROVOD_EVERY": "1"},
    "untraced": {},
    "default_floor": {"TF_OTEL_ENABLED": "1", "BENCH_PACER": "floor"},
    "default_yield": {"TF_OTEL_ENABLED": "1", "BENCH_PACER": "yield"},
}
DEFAULT_MODES = ["off", "default", "every"]
BASE = "off"
WORKERS = 2
CLASSES = 1000  # MobileNetV2's own head: the gradient all-reduce carries all 3.5 M parameters
# run-time estimate: a job's start (TF import, strategy, model build, first trace and the
# twin's) and a step on 2 shared cores; corrected from the runs as they finish
START_S = 40.0
STEP_S = 0.6


# -- worker (one MultiWorkerMirroredStrategy task) ----------------------------------------------


def build(side: int, batch: int, kind: str) -> Tuple[Any, Any, int]:
    """The benched job's Keras model (compiled under its strategy), its synthetic data and this
    worker's rank: MobileNetV2 of ``side``², ``batch`` per replica (bench_twin_paired.py too)."""
    import numpy as np
    import tensorflow as tf
    import tf_keras

    # first: the strategy must exist before any other TensorFlow work in the process
    if kind == "mirrored":
        cpus = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(REPLICAS)]
        )
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
        rank = 0
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank = int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    rng = np.random.default_rng(rank)
    global_batch = batch * strategy.num_replicas_in_sync
    images = rng.uniform(size=(global_batch * 4, side, side, 3)).astype("float32")
    labels = rng.integers(0, CLASSES, size=(global_batch * 4, 1)).astype("int64")
    data = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(global_batch)
    options = tf.data.Options()  # every worker its own synthetic data, no sharding work
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = data.with_options(options)
    with strategy.scope():
        model = tf_keras.applications.MobileNetV2(
            input_shape=(side, side, 3), weights=None, classes=CLASSES
        )
        model.compile(
            optimizer=tf_keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy"
        )
    return model, data, rank


def worker(side: int, batch: int, warmup: int, steps: int, kind: str = "mwms") -> None:
    """Train, print each step's wall time (ms) as a RESULT line."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 3 cannot fit under MWMS
    _bench_pacer(os.environ.get("BENCH_PACER", ""))
    import tf_keras

    model, data, rank = build(side, batch, kind)

    ends: List[float] = []

    class StepClock(tf_keras.callbacks.Callback):
        # no _supports_tf_logs: Keras hands this callback numpy logs, so each batch end
        # waits for its step (the wall time between two ends is one whole step)
        def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
            ends.append(time.perf_counter())

    total = 1 + warmup + steps  # step 0 traces the function (and its twin)
    model.fit(data, epochs=1, steps_per_epoch=total, callbacks=[StepClock()], verbose=0)
    # step_ms[i] is step i + 1
    step_ms = [(b - a) * 1e3 for a, b in zip(ends, ends[1:])]
    harness.emit_result({"rank": rank, "step_ms": step_ms})


def _bench_pacer(how: str) -> None:
    """The diagnostic modes' change to tf_otel's pacer, made here, in the bench's worker."""
    if not how:
        return
    from tf_otel.instrument import cpu_pacer

    if how == "floor":
        cpu_pacer.CEILING = cpu_pacer.FLOOR
    elif how == "yield":
        paced = cpu_pacer.Pacer.__call__

        def yielding(self: Any, frame: Any, event: str, arg: Any) -> None:
            if not self.events & 255:
                time.sleep(0)  # lets go of the GIL: a waiting thread takes it
            paced(self, frame, event, arg)

        cpu_pacer.Pacer.__call__ = yielding  # type: ignore[method-assign]


# -- driver -------------------------------------------------------------------------------------


def run_once(mode: str, round_no: int, args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """One 2-worker job of `mode`: its step times, detail steps and spans; None if it failed."""
    tmp = tempfile.mkdtemp(prefix="bench_tf_coll_")
    argv = [sys.executable, __file__, "--worker", f"--side={args.side}", f"--batch={args.batch}"]
    argv += [f"--warmup={args.warmup}", f"--steps={args.steps}", f"--strategy={args.strategy}"]
    members = []
    workers = _workers(args)
    clusters = _cluster_envs(workers) if args.strategy == "mwms" else [{}]
    for cluster in clusters:
        env = harness.job_env(
            TF_USE_LEGACY_KERAS="1",
            TF_OTEL_FILE=os.path.join(tmp, "spans-{rank}.jsonl"),
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
            TMPDIR=tmp,
            **cluster,
            **MODES[mode],
        )
        members.append((argv, env))
    load = os.getloadavg()[0]
    try:
        jobs = harness.launch_group(members, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(f"  round {round_no + 1} {mode}: timed out", flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    results = [r for job in jobs for r in job.results()]
    categories, detail = _spans(Path(tmp))
    shutil.rmtree(tmp, ignore_errors=True)
    if len(results) != workers:
        tails = "\n".join(f"rc={j.returncode}\n{j.stderr[-2000:]}" for j in jobs)
        print(f"  round {round_no + 1} {mode}: failed\n{tails}", flush=True)
        return None
    # the workers meet in every step's all-reduce: one step time, the mean of theirs
    per_rank = [r["step_ms"] for r in sorted(results, key=lambda r: r["rank"])]
    step_ms = [statistics.fmean(ms) for ms in zip(*per_rank)]
    timed = {i + 1: ms for i, ms in enumerate(step_ms) if i + 1 > args.warmup}
    detailed = [ms for step, ms in timed.items() if step in detail]
    plain = [ms for step, ms in timed.items() if step not in detail]
    row: Dict[str, Any] = {
        "mode": mode,
        "round": round_no,
        "mean_ms": statistics.fmean(timed.values()),
        "median_ms": statistics.median(timed.values()),
        "detail_steps": sorted(s for s in detail if s in timed),
        "detail_ms": statistics.median(detailed) if detailed else None,
        "plain_ms": statistics.median(plain) if plain else None,
        "spans": dict(categories),
        "load": load,
        "wall_s": max(job.wall_s for job in jobs),
    }
    print(
        f"  round {round_no + 1} {mode:8s} mean {row['mean_ms']:7.1f} ms  median "
        f"{row['median_ms']:7.1f} ms  detail steps {len(row['detail_steps'])}/{len(timed)}  "
        f"load {load:4.1f}  {row['wall_s']:4.0f} s  spans {dict(categories)}",
        flush=True,
    )
    return row


def _cluster_envs(workers: int) -> List[Dict[str, str]]:
    """Each MultiWorkerMirroredStrategy worker's TF_CONFIG and the coordinator's address."""
    addresses = [f"127.0.0.1:{port}" for port in harness.free_ports(workers)]
    coordinator = f"127.0.0.1:{harness.free_port_pair()}"
    return [
        {
            "TF_CONFIG": json.dumps(
                {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
            ),
            "TF_OTEL_COORDINATOR": coordinator,
        }
        for index in range(workers)
    ]


def _workers(args: argparse.Namespace) -> int:
    """Processes a job: MWMS one per worker; MirroredStrategy one for all its replicas."""
    return WORKERS if args.strategy == "mwms" else 1


def _spans(tmp: Path) -> Tuple[Counter, Set[int]]:
    """(span count per category, the steps with a collective span on any worker)."""
    categories: Counter = Counter()
    detail: Set[int] = set()
    for span in harness.written_spans(tmp):
        attrs = {a["key"]: a.get("value", {}) for a in span.get("attributes", [])}
        category = attrs.get("tf_otel.category", {}).get("stringValue", "?")
        categories[category] += 1
        if category == "collective":
            detail.add(int(attrs.get("tf_otel.step", {}).get("intValue", -1)))
    return categories, detail


def _spread(values: Sequence[float]) -> str:
    """median (min–max) of per-round ratios."""
    if len(values) == 1:
        return f"{values[0]:.3f}×"
    return f"**{statistics.median(values):.3f}×** ({min(values):.3f}–{max(values):.3f})"


def summarise(rows: List[Dict[str, Any]], args: argparse.Namespace) -> str:
    by_round: Dict[int, Dict[str, Dict[str, Any]]] = {}
    for row in rows:
        by_round.setdefault(row["round"], {})[row["mode"]] = row
    lines = [
        f"| mode | mean step ms (rounds) | median step ms | mean vs {BASE} (rounds) | "
        f"median vs {BASE} | detail steps / run | detail step vs other steps |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in args.modes:
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        # paired: only rounds where the baseline ran as well (same round, same load)
        pairs = [(rs[mode], rs[BASE]) for rs in by_round.values() if mode in rs and BASE in rs]
        mean_vs = [r["mean_ms"] / b["mean_ms"] for r, b in pairs]
        median_vs = [r["median_ms"] / b["median_ms"] for r, b in pairs]
        within = [r["detail_ms"] / r["plain_ms"] for r in mine if r["detail_ms"] and r["plain_ms"]]
        counts = [len(r["detail_steps"]) for r in mine]
        means = " / ".join(f"{r['mean_ms']:.1f}" for r in mine)
        lines.append(
            f"| {mode} | {means} | "
            f"{statistics.median(r['median_ms'] for r in mine):.1f} | "
            f"{_spread(mean_vs) if mode != BASE and mean_vs else '-'} | "
            f"{_spread(median_vs) if mode != BASE and median_vs else '-'} | "
            f"{'/'.join(map(str, counts))} of {args.steps} | "
            f"{_spread(within) if within else '-'} |"
        )
    loads = [r["load"] for r in rows]
    setup = (
        f"batch {args.batch} per worker, {WORKERS} workers (MultiWorkerMirroredStrategy, Keras "
        f"fit, tf_keras)"
        if args.strategy == "mwms"
        else f"batch {args.batch} per replica, {REPLICAS} replicas on logical CPU devices of one "
        f"process (MirroredStrategy, Keras fit, tf_keras)"
    )
    head = (
        f"{len(rows)} runs, {args.rounds} round(s), rotated order; MobileNetV2 {args.side}², "
        f"{setup}, {args.warmup} warm-up + {args.steps} timed steps a run; load average "
        f"(1 min) at run starts {min(loads):.1f}–{max(loads):.1f} on {os.cpu_count()} cores"
        f"{'; --quick' if args.quick else ''}"
    )
    notes = (
        f"\n\nStep times, so a ratio above 1 is slower. mean: a run's mean step time (its "
        f"detail steps included: what throughput sees); median: a typical step (1 detail step "
        f"in 20 does not move it). vs {BASE}: each round's ratio to the same round's {BASE} "
        f"run, median (min–max) over rounds. detail step vs other steps: within a run, the "
        f"median detail step over the median other step (the detail steps are those with "
        f"collective spans, by tf_otel.step)."
    )
    return head + "\n\n" + "\n".join(lines) + notes


def write_doc(path: Path, text: str) -> None:
    """``text`` as the generated section of the doc at ``path``; the rest of the file (the
    intro, the reading) stays. A new file starts with the intro of its strategy's doc."""
    if not path.exists():
        path.write_text(_MIRRORED_INTRO if path.name == DOCS["mirrored"].name else _DOC_INTRO)
    harness.write_generated(path, "bench_tf_collectives", text, TITLE)


TITLE = "tf_otel: the cost of timing TensorFlow's collectives"
_DOC_INTRO = f"""# {TITLE}

`bench/bench_tf_collectives.py` (its docstring has the modes): Keras `fit` of MobileNetV2
(tf_keras, 96², batch 8 per worker, synthetic data) under `MultiWorkerMirroredStrategy`, 2
workers on 127.0.0.1, one job per mode and round, modes rotated each round; step times measured
in-process by each worker. `default` (collective detail on 1 step in 20, the step function's
twin) against `off` (`TF_OTEL_HOROVOD=0`: step spans only). The script rewrites only its
generated section (between its markers); the rest of the file is kept between runs.
"""


_MIRRORED_INTRO = """# tf_otel: the cost of timing MirroredStrategy's collectives

`bench/bench_tf_collectives.py --strategy mirrored` (its docstring has the modes): Keras `fit`
of MobileNetV2 (tf_keras, 96², batch 8 per replica, synthetic data) under `MirroredStrategy` in
one process over 2 logical CPU devices (its default cross-device ops: collective ops, ring),
one job per mode and round, modes rotated each round; step times measured in-process.
`default` (collective detail on 1 step in 20, the step function's twin, both replicas' stamps
merged into the process's one collective span) against `off` (`TF_OTEL_HOROVOD=0`: step spans
only). The script rewrites only its generated section (between its markers); the rest of the
file is kept between runs.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--strategy", choices=sorted(DOCS), default="mwms")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"of {list(MODES)}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60, help="timed steps a run")
    parser.add_argument("--warmup", type=int, default=5, help="steps after step 0 not timed")
    parser.add_argument("--side", type=int, default=96, help="image side (pixels)")
    parser.add_argument("--batch", type=int, default=8, help="per worker")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a job")
    parser.add_argument("--quick", action="store_true", help="smoke: 1 round, 3 + 8 steps")
    parser.add_argument("--doc", help="the md file to write (default: docs/benchmarks/<...>.md)")
    parser.add_argument("--no-doc", action="store_true", help="do not write the md file")
    args = parser.parse_args()
    if args.worker:
        worker(args.side, args.batch, args.warmup, args.steps, args.strategy)
        return
    if args.quick:
        args.rounds, args.steps, args.warmup = 1, 8, 3
    args.modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in args.modes if m not in MODES]
    if bad or BASE not in args.modes:
        sys.exit(f"modes {bad or args.modes}: choose from {list(MODES)}, {BASE!r} among them")
    runs = args.rounds * len(args.modes)
    guess = runs * (START_S + (1 + args.warmup + args.steps) * STEP_S)
    print(
        f"{runs} runs ({args.rounds} rounds x {len(args.modes)} modes), {args.warmup} warm-up + "
        f"{args.steps} timed steps; estimated {guess / 60:.0f} min (job start ~{START_S:.0f} s "
        f"+ {STEP_S:.2f} s/step); load now {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    rows: List[Dict[str, Any]] = []
    started = time.monotonic()
    for round_no, got in harness.each_round(
        args.modes, args.rounds, lambda n, mode: run_once(mode, n, args)
    ):
        rows += [row for row in got.values() if row is not None]
        done = (round_no + 1) * len(args.modes)
        if done < runs:
            spent = time.monotonic() - started
            print(
                f"  {spent / 60:.1f} min so far, ~{spent / done * (runs - done) / 60:.1f} min left"
            )
    if not rows:
        sys.exit("no run succeeded")
    table = summarise(rows, args)
    print("\n" + table)
    if not args.no_doc and (args.doc or not args.quick):  # smoke numbers are not results
        doc = Path(args.doc or DOCS[args.strategy])
        command = " ".join(["bench/bench_tf_collectives.py"] + sys.argv[1:])
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
        write_doc(doc, f"Last run: {when} UTC, `{command}`\n\n{table}")
        print(f"\nwrote {doc}")


if __name__ == "__main__":
    main()
