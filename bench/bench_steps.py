"""Step-tracing overhead on Keras fit with ~20 ms steps: traced vs untraced, interleaved in one
run (machines are noisy), reported as the median of per-round ratios (each round runs every
variant back to back, in rotating order) and as a ratio of medians. The OTLP receiver runs in its
own process so that its parsing does not load the machine the bench measures on. Also: a traced
job with no collector listening vs untraced, whole-process wall time.

    .venv/bin/python bench/bench_steps.py [--rounds 10] [--steps 150] [--width 1024]

Writes the table into docs/benchmarks/steps.md (--out), between its generated-section markers
(harness.write_generated: the hand-written rest of the file stays).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
from pathlib import Path

import harness

REPO = Path(__file__).resolve().parent.parent
TITLE = "Step tracing overhead (bench/bench_steps.py)"
sys.path.insert(0, str(REPO / "tests"))
from otlp_receiver import OtlpReceiver  # noqa: E402
from ports import free_ports  # noqa: E402

PYTHON = sys.executable


def fit_seconds(extra: dict, steps: int, width: int) -> tuple[float, float]:
    """(fit time, whole process wall time) of one keras_fit.py run."""
    env = harness.job_env(
        PYTHONUNBUFFERED="1",
        PRINT_TIMING="1",
        EVALUATE="0",
        STEPS=str(steps),
        BATCH="256",
        WIDTH=str(width),
        **extra,
    )
    job = harness.launch([PYTHON, str(REPO / "examples" / "keras_fit.py")], env, check=True)
    return float(job.after("fit_seconds=")[0]), job.wall_s


def _serve_receiver(conn) -> None:
    with OtlpReceiver() as receiver:
        conn.send(receiver.env("grpc"))
        conn.recv()  # until the bench is done
        conn.send(len([s for s in receiver.spans() if s.category == "step"]))


def write_doc(path: Path, text: str) -> None:
    """``text`` as the generated section of the doc at ``path``; the rest of the file stays."""
    harness.write_generated(path, "bench_steps", text, TITLE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--out", default=str(harness.RESULTS / "steps.md"))
    args = parser.parse_args()
    parent, child = multiprocessing.Pipe()
    server = multiprocessing.Process(target=_serve_receiver, args=(child,), daemon=True)
    server.start()
    receiver_env = parent.recv()
    variants = {
        "untraced": {},
        "traced": {"TF_OTEL_ENABLED": "1", **receiver_env},
        "no_collector": {
            "TF_OTEL_ENABLED": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_ports()[0]}",
        },
    }
    names = list(variants)

    def run(i: int, name: str) -> tuple[float, float]:
        fit, wall = fit_seconds(variants[name], args.steps, args.width)
        print(
            f"round {i + 1}/{args.rounds} {name:12s} fit {fit:7.3f} s  wall {wall:6.2f} s",
            flush=True,
        )
        return fit, wall

    results = harness.interleaved(names, args.rounds, run)
    parent.send("done")
    spans = parent.recv()
    server.join(5)
    median_fit = {k: statistics.median(f for f, _ in v) for k, v in results.items()}
    median_wall = {k: statistics.median(w for _, w in v) for k, v in results.items()}

    def paired(name: str, index: int = 0) -> tuple[float, float, float]:
        base = [fit_wall[index] for fit_wall in results["untraced"]]
        values = [fit_wall[index] for fit_wall in results[name]]
        return harness.median_quartiles(harness.paired_ratios(values, base))

    step_ms = median_fit["untraced"] / args.steps * 1000
    ratio, ratio_q1, ratio_q3 = paired("traced")
    ratio_nc, nc_q1, nc_q3 = paired("no_collector")
    wall_ratio = paired("no_collector", 1)[0]
    load = os.getloadavg()[0]
    traced_step_ms = median_fit["traced"] / args.steps * 1000
    nc_step_ms = median_fit["no_collector"] / args.steps * 1000
    runs = "; ".join(f"{name} {', '.join(f'{f:.3f}' for f, _ in results[name])}" for name in names)
    text = f"""Keras 3 `fit`, {args.steps} steps of ~{step_ms:.1f} ms (Dense {args.width}×2, batch 256,
TF-CPU), one process per run, {args.rounds} rounds each running every variant back to back in
rotating order; fit time measured inside the process after a 3-step warm-up. Ratio: median of
the per-round ratios to the same round's untraced run [quartiles]. The OTLP receiver runs in a
separate process. Load average at the end: {load:.1f}.

| variant | median fit s | per step ms | per-round ratio [q1, q3] | ratio of medians | median wall s |
|---|---:|---:|---:|---:|---:|
| untraced | {median_fit["untraced"]:.3f} | {step_ms:.2f} | 1.000 | 1.000 | {median_wall["untraced"]:.2f} |
| traced, OTLP/gRPC | {median_fit["traced"]:.3f} | {traced_step_ms:.2f} | **{ratio:.3f}** [{ratio_q1:.3f}, {ratio_q3:.3f}] | {median_fit["traced"] / median_fit["untraced"]:.3f} | {median_wall["traced"]:.2f} |
| traced, no collector | {median_fit["no_collector"]:.3f} | {nc_step_ms:.2f} | {ratio_nc:.3f} [{nc_q1:.3f}, {nc_q3:.3f}] | {median_fit["no_collector"] / median_fit["untraced"]:.3f} | {median_wall["no_collector"]:.2f} |

Goal ≤ 1.01× for the traced fit. Whole-process wall time with no collector: {wall_ratio:.3f}×
the untraced one per round (SDK start-up and the bounded exit flush included). The receiver got
{spans} step spans (expected {args.rounds * (args.steps + 3)}).

Runs (fit s, in round order): {runs}.
"""
    write_doc(Path(args.out), text)
    print(text)


if __name__ == "__main__":
    main()
