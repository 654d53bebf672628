"""Step-tracing overhead inside one process: Keras 3's compiled train function (what fit calls
once per step) with ~20 ms steps, blocks of steps with tracing on and off alternating in the same
process (same graph, same threads, same load), spans exported over OTLP/gRPC to a receiver in
another process. Reported as the median of per-round ratios (on / off). Across processes this
machine's run-to-run spread (±20 %) hides a 1 % effect; within one process it does not. fit()
itself is not timed: on this VM whole fit() calls snap to multiples of ~2.55 s with or without
tf_otel (an artefact of fit's epoch machinery here), which would swamp the comparison.

    .venv/bin/python bench/bench_steps_inprocess.py [--rounds 20] [--block 60] [--width 1024]

Writes the run into docs/benchmarks/steps_inprocess.md (--out), between its generated-section
markers (harness.write_generated: the hand-written rest of the file stays); --append adds the run
to the runs already in that section instead of replacing them.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from bench_steps import _serve_receiver  # noqa: E402

MARKER = "bench_steps_inprocess"
TITLE = "Step tracing overhead in one process"


def write_doc(path: Path, text: str, append: bool = False) -> None:
    """``text`` as the generated section of the doc at ``path`` (``append``: after the runs
    already there); the rest of the file stays."""
    if append:
        text = harness.read_generated(path, MARKER) + "\n\n" + text
    harness.write_generated(path, MARKER, text, TITLE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--block", type=int, default=60)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--sample", type=float, default=1.0, help="traceidratio sampler arg")
    parser.add_argument(
        "--append", action="store_true", help="add to the runs in --out's generated section"
    )
    parser.add_argument("--out", default=str(harness.RESULTS / "steps_inprocess.md"))
    args = parser.parse_args()
    os.environ["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
    os.environ["OTEL_TRACES_SAMPLER_ARG"] = str(args.sample)
    parent, child = multiprocessing.Pipe()
    server = multiprocessing.Process(target=_serve_receiver, args=(child,), daemon=True)
    server.start()
    os.environ.update(parent.recv())
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"

    import tf_otel

    tf_otel.instrument()
    import numpy as np
    import tensorflow as tf

    from tf_otel.instrument import _patching

    keras = tf.keras
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256 * 8, 16)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(256).repeat()
    layers = [keras.Input((16,))]
    layers += [keras.layers.Dense(args.width, "relu") for _ in range(2)]
    model = keras.Sequential(layers + [keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(data, epochs=1, steps_per_epoch=5, verbose=0)  # trace and compile

    iterator = iter(data)
    train_function = model.make_train_function() or model.train_function  # the traced wrapper

    def block(traced: bool) -> float:
        (_patching.activate if traced else _patching.deactivate_steps)()
        t0 = time.perf_counter()
        for _ in range(args.block):
            logs = train_function(iterator)
        float(logs["loss"])  # wait for the last step
        return time.perf_counter() - t0

    on, off, ratios = [], [], []
    for i, blocks in harness.each_round(
        ["on", "off"], args.rounds, lambda _, mode: block(mode == "on")
    ):
        t_on, t_off = blocks["on"], blocks["off"]
        on.append(t_on)
        off.append(t_off)
        ratios.append(t_on / t_off)
        print(
            f"round {i + 1}/{args.rounds} on {t_on:.3f} s off {t_off:.3f} s ratio {ratios[-1]:.3f}",
            flush=True,
        )
    _patching.activate()
    tf_otel.shutdown()
    time.sleep(1)
    parent.send("done")
    spans = parent.recv()
    server.join(5)
    ratio, q1, q3 = harness.median_quartiles(ratios)
    step_ms = statistics.median(off) / args.block * 1000
    per_step_us = (statistics.median(on) - statistics.median(off)) / args.block * 1e6
    text = f"""## Step tracing overhead in one process (bench/bench_steps_inprocess.py)

Keras 3's compiled train function (one call per step, as in `fit`; Dense {args.width}×2, batch
256, TF-CPU), ~{step_ms:.1f} ms steps; {args.rounds}
rounds, each one block of {args.block} steps with tracing on and one with it off, in alternating
order, in one process (same graph and threads); on-blocks trace every step with sampler ratio
{args.sample} and export the sampled ones (root + rank span) over OTLP/gRPC to a receiver in
another process. Load average at the end: {os.getloadavg()[0]:.1f}.

| | value |
|---|---:|
| median per-round ratio on / off | **{ratio:.4f}** |
| quartiles of the ratio | {q1:.4f} – {q3:.4f} |
| median block off / on (s) | {statistics.median(off):.3f} / {statistics.median(on):.3f} |
| difference of medians per step | {per_step_us:.0f} µs |
| step spans received | {spans} (all steps: {args.rounds * args.block + 5}) |

Goal ≤ 1.01×.
"""
    write_doc(Path(args.out), text, append=args.append)
    print(text)


if __name__ == "__main__":
    main()
