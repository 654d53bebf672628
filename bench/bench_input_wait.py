"""Cost of the input-wait timing tail (instrument/input_wait.py, docs/guides/WHOLE_STEP.md).

``--model real`` (the default): a real model fed by a real tf.data pipeline, trained with Keras
``fit``, tf_otel installed in this process (step spans really built and written to an OTLP-JSON
file). The pipeline: TFRecord files of JPEG images written to a temp dir -> TFRecordDataset
(2 parallel reads) -> map(parse_single_example, decode_jpeg, resize, random flip / brightness /
crop, normalise; AUTOTUNE) -> batch -> prefetch(AUTOTUNE), feeding keras.applications
MobileNetV2 (weights=None). Two modes, the same model and process:

  on   input wait as shipped: the dataset iterated through its timing tail and the step hook's
       read of the totals at every step end
  off  neither (the hook removed, the dataset not timed); everything else of tf_otel on

Each round runs one ``fit`` per mode, in an order that alternates from round to round; a mode's
step time is the median interval between consecutive ``on_train_batch_end`` calls after the
warm-up steps (and the process CPU time over the same interval, all threads: what the tail
costs in work, less sensitive to other jobs on the host). Prints each round with the load
average, the on / off ratio of the medians over rounds and the median of the per-round ratios,
and what the tail read as input wait.

Then ``--pairs`` rounds of short blocks (``--block`` train-function calls, each a tf_otel step as
in ``fit``) on one live iterator per mode, in alternating order: the per-round ratios of wall
and CPU time, median and quartiles (the other jobs' load changes more slowly than a block), with
an A/A control (a second plain pipeline against the first) that shows the harness's own spread.
Then what the tail adds where it runs, resolved below the A/B's noise: the latency of a
``get_next`` (a tf.function that only takes the next batch, as a train function starts) on each
mode's live iterator, ``--gets`` alternating calls ``--gap-ms`` apart (the prefetch buffer
refills in between), and that difference plus the step end's read as a share of the step; and
the cost of ``iter()`` (a new tail traces two functions; a dataset iterated again reuses its).

``--model synthetic``: a ~10 ms Keras train function on a prefetched in-memory pipeline, the
plain dataset vs the timed one (``timed_dataset``), alternating rounds: the tail's own cost where
a step is short. Both print the per-step reads on the training thread (the totals, /proc).

    .venv/bin/python bench/bench_input_wait.py [--rounds 4] [--steps 40] [--warmup 5]
    .venv/bin/python bench/bench_input_wait.py --model synthetic [--rounds 6] [--steps 60]
    TF_USE_LEGACY_KERAS=1 .venv/bin/python bench/bench_input_wait.py    # tf_keras
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any, Dict, List, Tuple

import harness


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _write_records(tf: Any, directory: str, files: int, records: int, size: int) -> List[str]:
    import numpy as np

    rng = np.random.default_rng(0)
    paths = []
    for i in range(files):
        path = os.path.join(directory, f"images-{i}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(records):
                # smooth noise: JPEG-compressible like a photo, not like white noise
                small = rng.integers(0, 255, (size // 8, size // 8, 3), dtype=np.uint8)
                image = tf.image.resize(small, (size, size), method="bilinear")
                jpeg = tf.io.encode_jpeg(tf.cast(image, tf.uint8), quality=90).numpy()
                feature = {
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                    "label": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[int(rng.integers(0, 10))])
                    ),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
        paths.append(path)
    return paths


def _pipeline(tf: Any, paths: List[str], resolution: int, batch: int) -> Any:
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(record: Any) -> Any:
        example = tf.io.parse_single_example(record, spec)
        image = tf.io.decode_jpeg(example["image"], channels=3)
        image = tf.image.resize(image, (resolution + 8, resolution + 8))
        image = tf.image.random_crop(image, (resolution, resolution, 3))
        image = tf.image.random_flip_left_right(image)
        image = tf.image.random_brightness(image, 0.2)
        image = image / 127.5 - 1.0
        return image, example["label"]

    autotune = tf.data.AUTOTUNE
    ds = tf.data.TFRecordDataset(paths, num_parallel_reads=2).repeat()
    return ds.map(parse, num_parallel_calls=autotune).batch(batch).prefetch(autotune)


def real(args: argparse.Namespace) -> None:
    directory = tempfile.mkdtemp(prefix="bench_input_wait_")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.update(
        TF_OTEL_ENABLED="1",  # input wait: its default (TF_OTEL_INPUT_WAIT unset)
        TF_OTEL_FILE=os.path.join(directory, "spans.jsonl"),
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
    )
    import tf_otel

    tf_otel.instrument()
    import tensorflow as tf

    from tf_otel.instrument import _patching, input_wait

    keras = tf.keras
    paths = _write_records(tf, directory, args.files, args.records, args.image_size)
    print(
        f"keras {keras.__name__} {getattr(keras, '__version__', '')}, tensorflow {tf.__version__}, "
        f"{len(paths)} TFRecord files, {sum(os.path.getsize(p) for p in paths) / 1e6:.1f} MB, "
        f"MobileNetV2 {args.resolution}x{args.resolution} alpha {args.alpha}, batch {args.batch}, "
        f"{os.cpu_count()} cores, load {_load()}",
        flush=True,
    )
    model = keras.applications.MobileNetV2(
        input_shape=(args.resolution, args.resolution, 3),
        alpha=args.alpha,
        weights=None,
        classes=10,
    )
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    datasets = {
        "on": _pipeline(tf, paths, args.resolution, args.batch),
        "off": _pipeline(tf, paths, args.resolution, args.batch),
        "off2": _pipeline(tf, paths, args.resolution, args.batch),  # the A/A control's
    }
    datasets["off"]._tf_otel_timed = True  # iterated as is: no tail

    class Ends(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.ends: List[Tuple[float, float]] = []

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.ends.append((time.perf_counter(), time.process_time()))

    def fit(mode: str, steps: int) -> List[Tuple[float, float]]:
        if mode == "on":
            _patching.add_step_hook(input_wait.hook)
        if mode == "off":
            _patching.remove_step_hook(input_wait.hook)
        ends = Ends()
        model.fit(datasets[mode], steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[ends])
        pairs = zip(ends.ends, ends.ends[1:])
        return [(b[0] - a[0], b[1] - a[1]) for a, b in pairs][args.warmup :]

    fit("on", 3)  # build, trace and compile the train function; make the tail once
    fit("off", 3)
    medians: Dict[str, List[float]] = {"on": [], "off": []}
    means: Dict[str, List[float]] = {"on": [], "off": []}
    cpu: Dict[str, List[float]] = {"on": [], "off": []}
    waits: List[float] = []
    steps = args.steps + args.warmup + 1

    def one_fit(_: int, mode: str) -> str:
        before = input_wait.read_totals()
        intervals = fit(mode, steps)
        after = input_wait.read_totals()
        medians[mode].append(statistics.median(w for w, _ in intervals) * 1e3)
        means[mode].append(statistics.mean(w for w, _ in intervals) * 1e3)
        cpu[mode].append(statistics.median(c for _, c in intervals) * 1e3)
        if mode == "on":
            elements = int(after[1] - before[1])
            raw = int(after[0] - before[0])
            waits.append(max(0, raw - input_wait.floor_ns() * elements) / max(1, elements))
        return (
            f"{mode} {medians[mode][-1]:.1f} ms (mean {means[mode][-1]:.1f}, "
            f"CPU {cpu[mode][-1]:.1f})"
        )

    for r, shown in harness.each_round(["on", "off"], args.rounds, one_fit):
        line = ", ".join(shown.values())  # in the order they ran
        print(f"round {r + 1}/{args.rounds} [{line}] load {_load()}", flush=True)
    ratios = [a / b for a, b in zip(medians["on"], medians["off"])]
    print(f"step ms on  {[f'{t:.1f}' for t in medians['on']]}")
    print(f"step ms off {[f'{t:.1f}' for t in medians['off']]}")
    print(
        f"on / off: median of rounds {statistics.median(medians['on']):.2f} / "
        f"{statistics.median(medians['off']):.2f} ms = "
        f"{statistics.median(medians['on']) / statistics.median(medians['off']):.4f}; "
        f"median of the per-round ratios {statistics.median(ratios):.4f} "
        f"(rounds {', '.join(f'{x:.4f}' for x in ratios)}); "
        f"means {statistics.median(means['on']) / statistics.median(means['off']):.4f}"
    )
    cpu_ratios = [a / b for a, b in zip(cpu["on"], cpu["off"])]
    print(
        f"process CPU time a step (all threads; less sensitive to other jobs): on / off "
        f"{statistics.median(cpu['on']):.1f} / {statistics.median(cpu['off']):.1f} ms = "
        f"{statistics.median(cpu['on']) / statistics.median(cpu['off']):.4f}; per-round ratios "
        f"{', '.join(f'{x:.4f}' for x in cpu_ratios)}"
    )
    print(
        f"input wait the tail read (on rounds): {[f'{w / 1e3:.1f}' for w in waits]} us a batch; "
        f"tail floor (calibrated, subtracted) {input_wait.floor_ns() / 1e3:.1f} us an element"
    )
    if args.pairs:
        _paired(args, model, datasets, _patching, input_wait)
    _reads(input_wait)
    tf_otel.shutdown()
    print(f"load at the end {_load()}")


def _paired(
    args: argparse.Namespace, model: Any, datasets: Dict[str, Any], patching: Any, input_wait: Any
) -> None:
    """Short blocks of train-function calls (each a tf_otel step, as in fit) on one live
    iterator per mode, alternating: the other jobs' load changes more slowly than a block. An
    A/A control (two plain pipelines, "off2" against "off") in the same rounds shows what the
    harness reads where nothing differs."""
    import tensorflow as tf

    train = model.make_train_function() or model.train_function
    # made outside fit: "on" gets its tail explicitly (by default only Keras's own are timed)
    iterators = {
        "on": iter(input_wait.timed_dataset(datasets["on"])),
        "off": iter(datasets["off"]),
        "off2": iter(datasets["off2"]),
    }

    def block(mode: str) -> Tuple[float, float]:
        if mode == "on":
            patching.add_step_hook(input_wait.hook)
        else:
            patching.remove_step_hook(input_wait.hook)
        train(iterators[mode])  # the buffer the other block left full is not timed
        logs = None
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.block):
            logs = train(iterators[mode])
        float(logs["loss"])  # type: ignore[index]  # the last step has finished
        return time.perf_counter() - wall, time.process_time() - cpu

    for mode in iterators:
        block(mode)
    ratios: Dict[str, List[float]] = {"wall": [], "cpu": [], "aa_wall": [], "aa_cpu": []}
    step_off: List[float] = []
    pairs = harness.each_round(
        list(iterators), args.pairs, lambda _, mode: block(mode), rotate=False, reverse_odd=True
    )
    for i, result in pairs:
        ratios["wall"].append(result["on"][0] / result["off"][0])
        ratios["cpu"].append(result["on"][1] / result["off"][1])
        ratios["aa_wall"].append(result["off2"][0] / result["off"][0])
        ratios["aa_cpu"].append(result["off2"][1] / result["off"][1])
        step_off.append(result["off"][0] / args.block)
        print(
            f"pair {i + 1}/{args.pairs} on {result['on'][0] / args.block * 1e3:.1f} ms "
            f"off {result['off'][0] / args.block * 1e3:.1f} ms "
            f"off2 {result['off2'][0] / args.block * 1e3:.1f} ms a step, "
            f"on/off {ratios['wall'][-1]:.4f} (CPU {ratios['cpu'][-1]:.4f}), "
            f"A/A {ratios['aa_wall'][-1]:.4f}, load {_load()}",
            flush=True,
        )

    def summary(values: List[float]) -> str:
        median, q1, q3 = harness.median_quartiles(values)
        return f"{median:.4f} (quartiles {q1:.4f}-{q3:.4f})"

    print(
        f"paired blocks of {args.block} steps: on / off wall {summary(ratios['wall'])}, CPU "
        f"{summary(ratios['cpu'])}; A/A control (plain / plain) wall {summary(ratios['aa_wall'])}, "
        f"CPU {summary(ratios['aa_cpu'])}"
    )

    # what the tail adds where it runs: the consumer's get_next, on the step's critical path.
    # A tf.function that only takes the next batch (Keras's train function starts so), called
    # after a pause that lets the prefetch buffer refill, on and off alternating
    @tf.function
    def get(iterator: Any) -> Any:
        return tf.nest.flatten(next(iterator))[-1][0]

    def get_us(_: int, mode: str) -> float:
        time.sleep(args.gap_ms / 1e3)
        start = time.perf_counter_ns()
        get(iterators[mode]).numpy()
        return (time.perf_counter_ns() - start) / 1e3

    for mode in ("on", "off"):
        get(iterators[mode])
    latency = harness.interleaved(["on", "off"], args.gets, get_us)
    on_us, off_us = (statistics.median(latency[m]) for m in ("on", "off"))
    read_us = _per_call(input_wait.read_totals, 500)
    step_ms = statistics.median(step_off) * 1e3
    added = (on_us - off_us + read_us) / (step_ms * 1e3)
    print(
        f"get_next latency, median of {args.gets} alternating calls {args.gap_ms:.0f} ms apart: "
        f"on {on_us:.1f} us, off {off_us:.1f} us: the tail adds {on_us - off_us:.1f} us a batch; "
        f"with the step end's read ({read_us:.1f} us) {100 * added:.4f} % of the "
        f"{step_ms:.0f} ms step (the off blocks' median)"
    )
    # per iterator (Keras: every epoch): a new tail traces its two functions; a dataset iterated
    # again reuses its tail (the wrapper keeps it on the dataset)
    tail = input_wait.timed_dataset(datasets["on"])
    for name, make in (
        ("plain", lambda: iter(datasets["off"])),
        ("a new tail", lambda: iter(input_wait.timed_dataset(datasets["on"]))),
        ("the same tail again", lambda: iter(tail)),
    ):
        start = time.perf_counter()
        for _ in range(3):
            make()
        print(f"iter() {name}: {(time.perf_counter() - start) / 3 * 1e3:.1f} ms")


def synthetic(args: argparse.Namespace) -> None:
    import tensorflow as tf

    from tf_otel.instrument import input_wait

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

    def run(dataset: Any) -> float:
        iterator = iter(dataset)  # not patched here: the tail is added explicitly
        for _ in range(5):
            train(iterator)
        times = []
        for _ in range(args.steps):
            start = time.perf_counter_ns()
            train(iterator)
            times.append(time.perf_counter_ns() - start)
        return statistics.median(times) / 1e6

    datasets = {"plain": ds, "timed": input_wait.timed_dataset(ds)}
    print(f"load {_load()}")
    step_ms = harness.interleaved(list(datasets), args.rounds, lambda _, name: run(datasets[name]))
    plain, timed = step_ms["plain"], step_ms["timed"]
    ratio = statistics.median(timed) / statistics.median(plain)
    print(f"step ms plain {[f'{t:.2f}' for t in plain]}")
    print(f"step ms timed {[f'{t:.2f}' for t in timed]}")
    print(f"timed / plain (median of rounds): {ratio:.4f}; load {_load()}")
    _reads(input_wait)


def _reads(input_wait: Any) -> None:
    from tf_otel.instrument import step_resources

    proc = step_resources._Proc()
    print(f"read_totals() per step end: {_per_call(input_wait.read_totals, 500):.1f} us")
    print(f"/proc/self/io read: {_per_call(proc.read_io):.1f} us")
    print(f"/proc/self/statm read: {_per_call(proc.rss):.1f} us")


def _per_call(fn: Any, n: int = 2000) -> float:
    """Microseconds a call: the best of 5 rounds of n calls."""
    for _ in range(100):
        fn()
    best = []
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best.append((time.perf_counter_ns() - start) / n / 1000)
    return min(best)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("real", "synthetic"), default="real")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40, help="timed steps a round and mode")
    parser.add_argument("--warmup", type=int, default=5, help="steps of each fit not timed")
    parser.add_argument("--pairs", type=int, default=16, help="paired blocks after the fits")
    parser.add_argument("--block", type=int, default=5, help="train-function calls a block")
    parser.add_argument("--gets", type=int, default=200, help="get_next calls timed a mode")
    parser.add_argument("--gap-ms", type=float, default=150.0, help="pause before each")
    parser.add_argument("--resolution", type=int, default=96)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--records", type=int, default=256, help="images a file")
    parser.add_argument("--image-size", type=int, default=128, help="the stored JPEGs' side")
    args = parser.parse_args()
    (real if args.model == "real" else synthetic)(args)


if __name__ == "__main__":
    main()
