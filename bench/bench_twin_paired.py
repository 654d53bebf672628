"""What a detail twin's preparation costs a MirroredStrategy job's steps, measured inside one
job (issue 45): between jobs this machine's steps move ±10 %, more than the cost in question,
so the comparison is made in paired blocks of one job instead.

One process: bench_tf_collectives' mirrored model (Keras ``fit`` of MobileNetV2, tf_keras,
96², batch 8 per replica, 2 replicas on logical CPU devices), tf_otel with its defaults except
``TF_OTEL_HOROVOD_EVERY=1000000000`` (twins wanted and holding their timing ops, but no step
picked for detail, so no step runs one: blocks differ only in whether a twin is being
prepared). After a warm-up, each cycle runs three blocks of ``--block-steps`` steps:

  P  a twin of the step's function is being prepared (what tf_otel does after a new trace:
     traced on the ``tf_otel-twin`` thread, its MirroredStrategy replica threads paced,
     instantiated at nice 19); one preparation runs on across the P blocks (on 2 saturated
     cores a twin of this model takes minutes at the pacer's floor), a fresh one queued at a
     P block that finds none under way
  I  the preparation held: the twin's paced threads wait inside their pacer's look (asleep,
     off the GIL; the pause is not owed as CPU)
  A  held as in I: the A/A control

in the order P I A on even cycles and A I P on odd ones (I in the middle: a drift through the
job weighs on P/I and A/I alike). Per cycle: the median step of each block, P/I (the cost) and
A/I (what the comparison resolves); over the job, P and A against the I blocks either side
(bracketed: the trimmed mean of the ratios and its 95 % interval) and each kind's slowest step.
An instantiation (C++ at nice 19) is not held by the pause.

    .venv/bin/python bench/bench_twin_paired.py                  # 6 cycles
    .venv/bin/python bench/bench_twin_paired.py --cycles 24 --block-steps 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import harness

WARMUP = 8  # steps after the first (the program's trace) before the first block


def worker(cycles: int, block_steps: int) -> None:
    """One job: per block its kind and step times (ms), as a RESULT line."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_tf_collectives as collectives

    from tf_otel.instrument import cpu_pacer, detail_twin

    traced: List[Any] = []  # (function, args, kwargs) of the program's trace
    original = detail_twin._prepare_later

    def note(function: Any, args: tuple, kwargs: dict) -> None:
        traced.append((function, args, kwargs))

    detail_twin._prepare_later = note  # the job's own first preparation: the bench makes them
    paused = threading.Event()
    paused.set()
    look = cpu_pacer.Pacer.look

    def held_look(self: Any, wall: float, cpu: float) -> float:
        while paused.is_set():  # outside P blocks the twin's threads wait here, off the GIL
            time.sleep(0.05)
            wall, cpu = time.monotonic(), time.thread_time()
            self.last = self.window = (wall, cpu)  # the pause is not owed as CPU
        return look(self, wall, cpu)

    cpu_pacer.Pacer.look = held_look  # type: ignore[method-assign]
    import tf_keras

    plan: List[str] = []
    for cycle in range(cycles):
        plan += ["P", "I", "A"] if cycle % 2 == 0 else ["A", "I", "P"]
    blocks: List[Dict[str, Any]] = []
    state: Dict[str, Any] = {"last": None, "step": 0, "block": None, "queued": 0}

    def begin(kind: str) -> None:
        block: Dict[str, Any] = {"kind": kind, "ms": []}
        if kind == "P":
            if not detail_twin.preparing():  # none under way: a fresh twin, traced anew
                function, args, kwargs = traced[0]
                function._tf_otel_twin = None
                original(function, args, kwargs)
                state["queued"] += 1
            paused.clear()
        else:
            paused.set()
        blocks.append(block)
        state["block"] = block

    class Blocks(tf_keras.callbacks.Callback):
        # numpy logs (no _supports_tf_logs): each batch end waits for its step
        def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
            now = time.perf_counter()
            last, state["last"] = state["last"], now
            state["step"] += 1
            if last is None or state["step"] <= WARMUP:
                return
            block = state["block"]
            if block is not None:
                block["ms"].append((now - last) * 1e3)
                if len(block["ms"]) < block_steps:
                    return
                print(  # progress, on the bench's stderr
                    f"  block {len(blocks)}/{len(plan)} {block['kind']}: median "
                    f"{statistics.median(block['ms']):.0f} ms; generations queued/prepared "
                    f"{detail_twin.generations()[:2]}",
                    file=sys.stderr,
                    flush=True,
                )
            if len(blocks) == len(plan):
                paused.clear()  # the exit abandons what is under way
                self.model.stop_training = True
                return
            begin(plan[len(blocks)])

    model, data, _ = collectives.build(96, 8, "mirrored")
    model.fit(data, epochs=1, steps_per_epoch=100_000, callbacks=[Blocks()], verbose=0)
    harness.emit_result(
        {"blocks": blocks, "generations": detail_twin.generations(), "queued": state["queued"]}
    )


def run_job(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    env = harness.job_env(
        TF_OTEL_ENABLED="1",
        TF_USE_LEGACY_KERAS="1",
        TF_OTEL_HOROVOD_EVERY="1000000000",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        # the pacer's share on saturated cores (diagnostic: is the cost that share?)
        **({"TF_OTEL_TWIN_CPU_FLOOR": str(args.floor)} if args.floor else {}),
    )
    argv = [
        sys.executable,
        __file__,
        "--worker",
        f"--cycles={args.cycles}",
        f"--block-steps={args.block_steps}",
    ]
    # the worker's stderr passes through: its progress (and TensorFlow's own lines)
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True, timeout=args.timeout)
    for line in done.stdout.splitlines():
        if line.startswith(harness.RESULT):
            return json.loads(line[len(harness.RESULT) :])
    print(f"failed rc={done.returncode}", flush=True)
    return None


def report(result: Dict[str, Any]) -> List[str]:
    """One row per cycle, then the medians and ranges of P/I and A/I."""
    blocks = result["blocks"]
    rows = [
        "| cycle | order | steps per block | P median ms | I median ms | A median ms | P/I | A/I |",
        "|---|---|---|---|---|---|---|---|",
    ]
    costs, controls = [], []
    for start in range(0, len(blocks) - 2, 3):
        cycle = blocks[start : start + 3]
        medians = {b["kind"]: statistics.median(b["ms"]) for b in cycle}
        cost, control = medians["P"] / medians["I"], medians["A"] / medians["I"]
        costs.append(cost)
        controls.append(control)
        sizes = "/".join(str(len(b["ms"])) for b in cycle)
        rows.append(
            f"| {start // 3 + 1} | {''.join(b['kind'] for b in cycle)} | {sizes} | "
            f"{medians['P']:.0f} | {medians['I']:.0f} | {medians['A']:.0f} | "
            f"{cost:.3f} | {control:.3f} |"
        )
    if costs:
        rows += ["", *bracketed(blocks)]
        rows.append("")
        rows.append(
            f"P/I (the cost): median {statistics.median(costs):.3f} "
            f"({min(costs):.3f}-{max(costs):.3f}); A/I (the control): median "
            f"{statistics.median(controls):.3f} ({min(controls):.3f}-{max(controls):.3f}); "
            f"{len(costs)} cycles; twins queued {result['queued']}, generations "
            f"queued/prepared {result['generations'][:2]}"
        )
    return rows


def bracketed(blocks: List[Dict[str, Any]]) -> List[str]:
    """P and A against the I blocks either side of them (bench_real_model's bracketed reading:
    a drift over minutes moves both sides alike): the trimmed mean of the blocks' median-step
    ratios with its 95 % interval, and the slowest single step of each kind over the I
    median around it (a preparation that stalled one step shows there, not in a median)."""
    import bench_real_model

    timeline = [
        ("untraced" if b["kind"] == "I" else b["kind"], statistics.median(b["ms"])) for b in blocks
    ]
    lines = []
    for kind, name in (("P", "being prepared"), ("A", "A/A control")):
        ratios, worst = [], []
        for i, (mode, value) in enumerate(timeline):
            base = bench_real_model._untraced_around(timeline, i) if mode == kind else None
            if base is not None:
                ratios.append(value / base)
                worst.append(max(blocks[i]["ms"]) / base)
        if ratios:
            lines.append(
                f"{kind}/I bracketed ({name}), step time: "
                f"{bench_real_model._trimmed_mean_ci(ratios)}; slowest step "
                f"{max(worst):.2f}x the I median around it, median block's slowest "
                f"{statistics.median(worst):.2f}x"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--block-steps", type=int, default=40)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument(
        "--floor",
        type=float,
        default=0.0,
        help="TF_OTEL_TWIN_CPU_FLOOR for the job (0: its default)",
    )
    args = parser.parse_args()
    if args.worker:
        worker(args.cycles, args.block_steps)
        return
    started = time.monotonic()
    load = os.getloadavg()[0]
    result = run_job(args)
    if result is None:
        sys.exit(1)
    print("\n".join(report(result)))
    print(f"job {time.monotonic() - started:.0f} s, load at start {load:.1f}")


if __name__ == "__main__":
    main()
