"""What a detail twin's trace costs the steps of a MirroredStrategy job while it runs, and on
which threads (issue 45, instrument/twin_threads.py): one process per mode, bench_tf_collectives'
mirrored worker (Keras ``fit`` of MobileNetV2, tf_keras, 96², batch 8 per replica, 2 replicas on
logical CPU devices), with a sampler thread reading every Python thread's CPU time from
/proc/self/task every 0.2 s. MirroredStrategy traces each replica's function on a thread of its
own (``_MirroredReplicaThread``); the replica threads the twin's trace starts are those first
seen after the twin thread.

Modes (all TF_OTEL_ENABLED=1):

  off        TF_OTEL_HOROVOD=0: no collective detail, no twin
  default    the defaults: the twin prepared on the tf_otel-twin thread, its replica threads paced
  unpaced    default with the twin's replica threads left unpaced (``detail_twin.pacer_here``
             answers None in the bench's worker): what the steps paid before twin_threads.py

Per mode: the median step while the twin's replica threads were alive (their first sighting to
their last, or to the job's end) against the median step after them (for ``off``, which has no
twin, the steps of the same indexes as the round's ``default`` job), and the CPU seconds of the
twin's replica threads. One process per mode and
round, the modes rotated each round.

    .venv/bin/python bench/bench_twin_threads.py                 # 2 rounds, 40 steps
    .venv/bin/python bench/bench_twin_threads.py --rounds 3 --steps 60
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

MODES: Dict[str, Dict[str, str]] = {
    "off": {"TF_OTEL_HOROVOD": "0"},
    "default": {},
    "unpaced": {"BENCH_UNPACED_THREADS": "1"},
}
TICK = os.sysconf("SC_CLK_TCK")


def _sample(seen: Dict[int, Dict[str, Any]], stop: threading.Event, t0: float) -> None:
    """Each live thread's CPU seconds, first and last sighting (seconds since t0)."""
    while not stop.is_set():
        now = time.monotonic() - t0
        for thread in threading.enumerate():
            tid = thread.native_id
            if tid is None:
                continue
            try:
                fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            entry = seen.setdefault(tid, {"kind": type(thread).__name__, "name": thread.name})
            entry.setdefault("first", now)
            entry["last"] = now
            entry["cpu"] = (int(fields[11]) + int(fields[12])) / TICK
        stop.wait(0.2)


def worker(steps: int) -> None:
    """One job: step end times and the threads' CPU, as a RESULT line."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_tf_collectives as collectives

    if os.environ.get("BENCH_UNPACED_THREADS"):
        from tf_otel.instrument import detail_twin

        detail_twin.pacer_here = lambda: None  # type: ignore[assignment]
    emitted: List[Dict[str, Any]] = []
    emit = harness.emit_result
    harness.emit_result = emitted.append  # the collectives worker's line: kept here instead
    seen: Dict[int, Dict[str, Any]] = {}
    stop = threading.Event()
    t0 = time.monotonic()
    sampler = threading.Thread(target=_sample, args=(seen, stop, t0), name="bench-sampler")
    sampler.start()
    try:
        collectives.worker(96, 8, 5, steps, "mirrored")
    finally:
        harness.emit_result = emit
    ended = time.monotonic() - t0
    stop.set()
    sampler.join()
    step_ms = emitted[0]["step_ms"]
    ends, at = [], ended
    for ms in reversed(step_ms):  # each step's end, back from the last
        ends.append(at)
        at -= ms / 1e3
    harness.emit_result(
        {"step_ms": step_ms, "ends": list(reversed(ends)), "threads": list(seen.values())}
    )


def _twin_window(threads: List[Dict[str, Any]]) -> Optional[Dict[str, float]]:
    """The twin's replica threads: first seen after the twin thread; their window and CPU."""
    twin = [t for t in threads if t["name"].startswith("tf_otel-twin")]
    if not twin:
        return None
    started = min(t["first"] for t in twin)
    replicas = [
        t for t in threads if t["kind"] == "_MirroredReplicaThread" and t["first"] >= started
    ]
    if not replicas:
        return {"from": started, "to": started, "cpu": 0.0, "twin_cpu": twin[0]["cpu"]}
    return {
        "from": min(t["first"] for t in replicas),
        "to": max(t["last"] for t in replicas),
        "cpu": sum(t["cpu"] for t in replicas),
        "twin_cpu": twin[0]["cpu"],
    }


def run_once(mode: str, args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    env = harness.job_env(
        TF_OTEL_ENABLED="1",
        TF_USE_LEGACY_KERAS="1",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        **MODES[mode],
    )
    argv = [sys.executable, __file__, "--worker", f"--steps={args.steps}"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.timeout)
    results = [
        json.loads(line[len(harness.RESULT) :])
        for line in done.stdout.splitlines()
        if line.startswith(harness.RESULT)
    ]
    if not results:
        print(f"  {mode}: failed rc={done.returncode}\n{done.stderr[-2000:]}", flush=True)
        return None
    return results[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps)
        return
    modes = args.modes.split(",")
    rows: List[str] = []
    for round_no in range(args.rounds):
        order = modes[round_no % len(modes) :] + modes[: round_no % len(modes)]
        jobs: Dict[str, Dict[str, Any]] = {}
        for mode in order:
            load = os.getloadavg()[0]
            result = run_once(mode, args)
            if result is not None:
                result["load"] = load
                jobs[mode] = result
        # the steps (by index) begun in the twin's replica-thread window of this round's
        # default job; a job without a twin (off) is read over the same steps
        reference = jobs.get("default")
        ref_twin = _twin_window(reference["threads"]) if reference else None
        if reference is None or ref_twin is None:
            print(f"  round {round_no + 1}: no default job with a twin", flush=True)
            continue
        begins = [e - ms / 1e3 for e, ms in zip(reference["ends"], reference["step_ms"])]
        inside_at = {i for i, b in enumerate(begins) if ref_twin["from"] <= b <= ref_twin["to"]}
        for mode, result in jobs.items():
            step_ms = result["step_ms"]
            twin = _twin_window(result["threads"])
            if twin is not None:
                own = [e - ms / 1e3 for e, ms in zip(result["ends"], step_ms)]
                at = {i for i, b in enumerate(own) if twin["from"] <= b <= twin["to"]}
            else:
                at = inside_at
            inside = [ms for i, ms in enumerate(step_ms) if i in at]
            after = [ms for i, ms in enumerate(step_ms) if i not in at and i > min(at, default=0)]
            line = (
                f"| {round_no + 1} | {mode} | {len(inside)} | "
                f"{statistics.median(inside) if inside else float('nan'):.0f} | {len(after)} | "
                f"{statistics.median(after) if after else float('nan'):.0f} | "
                f"{twin['cpu'] if twin else 0.0:.1f} | {twin['twin_cpu'] if twin else 0.0:.1f} | "
                f"{result['load']:.1f} |"
            )
            rows.append(line)
            print(line, flush=True)
    print(
        "\n| round | mode | steps begun in the twin's replica-thread window | median ms | "
        "steps after | median ms | twin replica threads' CPU s | twin thread CPU s | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
