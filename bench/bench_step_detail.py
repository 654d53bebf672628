"""Cost of the resource-detail steps (instrument/step_detail.py, docs/guides/WHOLE_STEP.md), in process,
no TensorFlow: the hook on a step that is NOT a detail step (what TF_OTEL_RESOURCES_EVERY=N adds
to the N-1 other steps), and a detail step's begin + end (fd scan, sampler wake-up, positions)
with FILES regular files open, for a step of STEP_MS; rounds interleave the two. Also the busy
time the sampler thread adds during a detail step (process CPU time over a sleeping step).

    .venv/bin/python bench/bench_step_detail.py [--rounds 5] [--files 32] [--step-ms 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any


def _handle(step: int) -> Any:
    from tf_otel.step_handle import StepHandle

    return StepHandle("bench", step, "bench_step", "tf_function", 0, True, 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--files", type=int, default=32)
    parser.add_argument("--step-ms", type=float, default=20.0)
    args = parser.parse_args()

    from tf_otel.instrument.step_detail import DetailHook

    hook = DetailHook(every=1_000_000)
    detail = DetailHook(every=1)
    tmp = tempfile.mkdtemp()
    held = [open(os.path.join(tmp, f"f{i}"), "wb") for i in range(args.files)]
    print(f"load {os.getloadavg()[0]:.2f}, fds {len(os.listdir('/proc/self/fd'))}")
    other_us, begin_end_us, cpu_share = [], [], []
    for _ in range(args.rounds):
        n = 20_000
        handles = [_handle(step) for step in range(1, n + 1)]
        t0 = time.perf_counter_ns()
        for handle in handles:
            kept = hook.on_step_start(handle, None)  # type: ignore[arg-type]
            hook.on_step_end(handle, None, None, kept)  # type: ignore[arg-type]
        other_us.append((time.perf_counter_ns() - t0) / n / 1e3)
        costs = []
        cpu_over = []
        for step in range(20):
            handle = _handle(step * 2)  # never consecutive: a full scan at each begin
            t0 = time.perf_counter_ns()
            kept = detail.on_step_start(handle, None)  # type: ignore[arg-type]
            t1 = time.perf_counter_ns()
            c0 = time.process_time_ns()
            time.sleep(args.step_ms / 1e3)
            c1 = time.process_time_ns()
            t2 = time.perf_counter_ns()
            detail.on_step_end(handle, None, None, kept)  # type: ignore[arg-type]
            costs.append(((t1 - t0) + (time.perf_counter_ns() - t2)) / 1e3)
            cpu_over.append((c1 - c0) / (args.step_ms * 1e6))
        begin_end_us.append(statistics.median(costs))
        cpu_share.append(statistics.median(cpu_over))
    for f in held:
        f.close()
    print(f"non-detail step, hook start+end: {statistics.median(other_us):.2f} us "
          f"(rounds {', '.join(f'{x:.2f}' for x in other_us)})")  # fmt: skip
    print(f"detail step begin+end on the training thread: {statistics.median(begin_end_us):.0f} us "
          f"(rounds {', '.join(f'{x:.0f}' for x in begin_end_us)})")  # fmt: skip
    print(f"sampler CPU during a {args.step_ms:.0f} ms detail step: "
          f"{100 * statistics.median(cpu_share):.1f} % of one core "
          f"(rounds {', '.join(f'{100 * x:.1f}' for x in cpu_share)})")  # fmt: skip


if __name__ == "__main__":
    main()
