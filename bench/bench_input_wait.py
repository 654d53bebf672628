"""Cost of the always-on whole-step parts (docs/WHOLE_STEP.md), side by side and interleaved.

1. The input-wait timing tail (instrument/input_wait.py) on a Keras train function of ~10 ms a
   step fed by a prefetched tf.data pipeline: rounds alternate the plain dataset and the timed
   one, same model, same process; the median step time of each is compared.
2. The per-step reads on the training thread: the tail's totals (one eager variable read) and
   /proc/self/io + /proc/self/statm (instrument/step_resources.py), in microseconds a call.

    .venv/bin/python bench/bench_input_wait.py [--rounds 6] [--steps 60]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()

    import tensorflow as tf

    from tf_otel.instrument import input_wait, step_resources

    width = 512
    ds = (
        tf.data.Dataset.from_tensors((tf.ones([64, width]), tf.ones([64, 1])))
        .repeat()
        .map(lambda x, y: (x * 1.0, y))
        .prefetch(2)
    )
    model = tf.keras.Sequential(
        [tf.keras.Input((width,))]
        + [tf.keras.layers.Dense(width, activation="relu") for _ in range(6)]
        + [tf.keras.layers.Dense(1)]
    )
    model.compile(optimizer="sgd", loss="mse")
    model.make_train_function()
    train = model.train_function

    def run(dataset: tf.data.Dataset) -> float:
        iterator = iter(dataset)  # not patched here: the tail is added explicitly
        for _ in range(5):
            train(iterator)
        times = []
        for _ in range(args.steps):
            start = time.perf_counter_ns()
            train(iterator)
            times.append(time.perf_counter_ns() - start)
        return statistics.median(times) / 1e6

    plain, timed = [], []
    for _ in range(args.rounds):
        plain.append(run(ds))
        timed.append(run(input_wait.timed_dataset(ds)))
    ratio = statistics.median(timed) / statistics.median(plain)
    print(f"step ms plain {[f'{t:.2f}' for t in plain]}")
    print(f"step ms timed {[f'{t:.2f}' for t in timed]}")
    print(f"timed / plain (median of rounds): {ratio:.4f}")

    totals = input_wait._state["totals"]
    proc = step_resources._Proc()

    def per_call(fn, n=2000) -> float:
        for _ in range(100):
            fn()
        best = []
        for _ in range(5):
            start = time.perf_counter_ns()
            for _ in range(n):
                fn()
            best.append((time.perf_counter_ns() - start) / n / 1000)
        return min(best)

    print(f"totals.numpy() per step end: {per_call(totals.numpy, 500):.1f} us")
    print(f"/proc/self/io read: {per_call(proc.read_io):.1f} us")
    print(f"/proc/self/statm read: {per_call(proc.rss):.1f} us")


if __name__ == "__main__":
    main()
