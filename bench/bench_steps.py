"""Step-tracing overhead on Keras fit with ~20 ms steps: traced vs untraced, interleaved in one
run (machines are noisy), reported as a ratio of medians. Also: a traced job with no collector
listening vs untraced, whole-process wall time.

    .venv/bin/python bench/bench_steps.py [--pairs 6] [--steps 150]

Writes docs/BENCHMARKS_steps.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from otlp_receiver import OtlpReceiver  # noqa: E402

PYTHON = sys.executable


def env_for(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TF_OTEL_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **extra)
    return env


def fit_seconds(extra: dict, steps: int) -> tuple[float, float]:
    """(fit time, whole process wall time) of one keras_fit.py run."""
    env = env_for(
        {
            "PRINT_TIMING": "1",
            "EVALUATE": "0",
            "STEPS": str(steps),
            "BATCH": "256",
            "WIDTH": "640",
            **extra,
        }
    )
    t0 = time.perf_counter()
    out = subprocess.run(
        [PYTHON, str(REPO / "examples" / "keras_fit.py")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    wall = time.perf_counter() - t0
    fit = float(
        next(line for line in out.splitlines() if line.startswith("fit_seconds=")).split("=")[1]
    )
    return fit, wall


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--out", default=str(REPO / "docs" / "BENCHMARKS_steps.md"))
    args = parser.parse_args()
    results: dict = {"untraced": [], "traced": [], "no_collector": []}
    with OtlpReceiver() as receiver:
        variants = {
            "untraced": {},
            "traced": {"TF_OTEL_ENABLED": "1", **receiver.env("grpc")},
            "no_collector": {
                "TF_OTEL_ENABLED": "1",
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
            },
        }
        for i in range(args.pairs):
            for name, extra in variants.items():
                results[name].append(fit_seconds(extra, args.steps))
                fit, wall = results[name][-1]
                print(
                    f"pair {i + 1}/{args.pairs} {name:12s} fit {fit:7.3f} s  wall {wall:6.2f} s",
                    flush=True,
                )
        spans = len([s for s in receiver.spans() if s.category == "step"])
    median_fit = {k: statistics.median(f for f, _ in v) for k, v in results.items()}
    median_wall = {k: statistics.median(w for _, w in v) for k, v in results.items()}
    step_ms = median_fit["untraced"] / args.steps * 1000
    ratio = median_fit["traced"] / median_fit["untraced"]
    ratio_nc = median_fit["no_collector"] / median_fit["untraced"]
    wall_ratio = median_wall["no_collector"] / median_wall["untraced"]
    load = os.getloadavg()[0]
    text = f"""## Step tracing overhead (bench/bench_steps.py)

Keras 3 `fit`, {args.steps} steps of ~{step_ms:.1f} ms (Dense 640×2, batch 256, TF-CPU), one
process per run, {args.pairs} runs of each variant interleaved in one session; fit time measured
inside the process after a 3-step warm-up; medians. Load average at the end: {load:.1f}.

| variant | median fit s | per step ms | ratio to untraced | median process wall s |
|---|---:|---:|---:|---:|
| untraced | {median_fit["untraced"]:.3f} | {step_ms:.2f} | 1.000 | {median_wall["untraced"]:.2f} |
| traced, OTLP/gRPC to a receiver | {median_fit["traced"]:.3f} | {median_fit["traced"] / args.steps * 1000:.2f} | **{ratio:.3f}** | {median_wall["traced"]:.2f} |
| traced, no collector listening | {median_fit["no_collector"]:.3f} | {median_fit["no_collector"] / args.steps * 1000:.2f} | {ratio_nc:.3f} | {median_wall["no_collector"]:.2f} |

Goal ≤ 1.01× for the traced fit. The whole-process wall time with no collector is
{wall_ratio:.3f}× the untraced one (start-up of the SDK and the bounded exit flush included).
The receiver got {spans} step spans over the traced runs (expected {args.pairs * (args.steps + 3)}).
Runs (fit s): untraced {", ".join(f"{f:.3f}" for f, _ in results["untraced"])}; traced
{", ".join(f"{f:.3f}" for f, _ in results["traced"])}; no collector
{", ".join(f"{f:.3f}" for f, _ in results["no_collector"])}.
"""
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
