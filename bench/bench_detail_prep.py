"""What each detail preparation costs, and where it runs (issue 45): one process, no Horovod,
a keras.applications model's training step (weights=None, synthetic batch), TF-CPU.

- the detail twin (instrument/detail_twin.py): its trace and its instantiation, as the twin thread
  does them, and its first run after that against its first run without it (what the warm
  detail step paid on the training thread before issue 45) and a steady step;
- op detail (instrument/ops/hook.py, TF2): starting TF's profiler session before an op-traced
  step and ``export_to_tb`` after it, both on the training thread, against a plain step;
- TF1 graph stamps (instrument/horovod/graph_stamps.py): a detail step's ``Session.run``
  fetches the stamps too, a new fetch signature, so TensorFlow prunes the graph and builds an
  executor for it on the first such run: a run with one extra fetch, first and steady; and
  what tf_otel does instead: that run built ahead on another thread (``graph_stamps.build``,
  nothing run: the bench checks the step counter did not move), then its first run.

    .venv/bin/python bench/bench_detail_prep.py                   # MobileNetV2 96², 3 repeats
    .venv/bin/python bench/bench_detail_prep.py --model EfficientNetB0 --side 128
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def twin_costs(args: argparse.Namespace) -> Dict[str, float]:
    import tensorflow as tf

    from tf_otel.instrument import detail_twin, twin_tf

    model = getattr(tf.keras.applications, args.model)(
        weights=None, input_shape=(args.side, args.side, 3), classes=10
    )
    opt = tf.keras.optimizers.SGD(0.01)
    x = tf.random.uniform((args.batch, args.side, args.side, 3))
    y = tf.zeros((args.batch,), tf.int64)

    @tf.function
    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, logits))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    out: Dict[str, float] = {}
    out["program first call (trace, instantiate, run)"] = timed(lambda: step(x, y).numpy())
    out["steady step"] = statistics.median(timed(lambda: step(x, y).numpy()) for _ in range(5))
    cold = step._clone(None)  # a twin run without preparation: the warm step before issue 45
    out["twin trace, training thread (before)"] = timed(lambda: cold.get_concrete_function(x, y))
    out["twin first run unprepared (before: the warm step)"] = timed(lambda: cold(x, y).numpy())
    prepared = step._clone(None)
    where: List[str] = []

    def prepare() -> None:
        where.append(threading.current_thread().name)
        t0 = time.perf_counter()
        concrete = prepared.get_concrete_function(x, y)
        out["twin trace, twin thread"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        twin_tf.instantiate(concrete, (x, y), {})
        out["twin instantiation, twin thread (not run)"] = time.perf_counter() - t0

    thread = threading.Thread(target=prepare, name=detail_twin.THREAD_NAME)
    thread.start()
    thread.join()
    out["twin first run after preparation (the first detail step)"] = timed(
        lambda: prepared(x, y).numpy()
    )
    out["twin steady run"] = statistics.median(
        timed(lambda: prepared(x, y).numpy()) for _ in range(5)
    )
    assert where == [detail_twin.THREAD_NAME]

    from tensorflow.python.profiler.internal import _pywrap_profiler

    starts, exports, profiled = [], [], []
    for _ in range(3):
        logdir = tempfile.mkdtemp(prefix="bench_ops_")
        session = _pywrap_profiler.ProfilerSession()
        starts.append(timed(lambda: session.start(logdir, {"host_tracer_level": 2})))  # noqa: B023
        profiled.append(timed(lambda: step(x, y).numpy()))
        exports.append(timed(session.export_to_tb))  # noqa: B023
        shutil.rmtree(logdir, ignore_errors=True)
    out["op detail: profiler start (training thread)"] = statistics.median(starts)
    out["op detail: the profiled step"] = statistics.median(profiled)
    out["op detail: export_to_tb (training thread)"] = statistics.median(exports)
    return out


def tf1_costs(args: argparse.Namespace) -> Dict[str, float]:
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        v1.keras.backend.set_learning_phase(1)
        x = tf.random.uniform((args.batch, args.side, args.side, 3))
        model = tf.keras.applications.MobileNetV2(
            weights=None, input_shape=(args.side, args.side, 3), classes=10
        )
        loss = tf.reduce_mean(model(x))
        train = v1.train.GradientDescentOptimizer(0.01).minimize(loss)
        stamp = tf.timestamp()  # stands for a collective's stamp: an extra fetch
        ahead = tf.timestamp()  # another: the run fetching it is built ahead
        counter = v1.get_variable("counter", [], initializer=v1.zeros_initializer())
        with tf.control_dependencies([train]):
            train = tf.group(v1.assign_add(counter, 1.0))
        init = v1.global_variables_initializer()
    session = v1.Session(graph=graph)
    session.run(init)
    out: Dict[str, float] = {}
    out["TF1 first run (executor built)"] = timed(lambda: session.run([train, loss]))
    out["TF1 steady run"] = statistics.median(
        timed(lambda: session.run([train, loss])) for _ in range(5)
    )
    out["TF1 first run with the stamps fetched (a new executor)"] = timed(
        lambda: session.run(([train, loss], [stamp]))
    )
    out["TF1 steady run with the stamps fetched"] = statistics.median(
        timed(lambda: session.run(([train, loss], [stamp]))) for _ in range(5)
    )
    from tf_otel.instrument.horovod import graph_stamps

    before = session.run(counter)
    builder = threading.Thread(
        target=lambda: out.__setitem__(
            "TF1 run with the stamps built ahead (another thread; not run)",
            timed(lambda: graph_stamps.build(session, [train], [loss, ahead], [])),
        )
    )
    builder.start()
    builder.join()
    if session.run(counter) != before:
        raise SystemExit("the run built ahead ran")
    out["TF1 its first run, built ahead"] = timed(lambda: session.run(([train, loss], [ahead])))
    session.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="MobileNetV2")
    parser.add_argument("--side", type=int, default=96)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="processes, one after another")
    parser.add_argument("--worker", choices=["tf2", "tf1"])
    args = parser.parse_args()
    if args.worker:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        result = twin_costs(args) if args.worker == "tf2" else tf1_costs(args)
        for name, seconds in result.items():
            print(f"COST {name}\t{seconds:.4f}", flush=True)
        return
    import subprocess
    import sys

    rows: Dict[str, List[float]] = {}
    loads = []
    for _ in range(args.repeats):
        for kind in ("tf2", "tf1"):
            loads.append(os.getloadavg()[0])
            argv = [sys.executable, __file__, f"--worker={kind}", f"--model={args.model}"]
            argv += [f"--side={args.side}", f"--batch={args.batch}"]
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TF_OTEL_"))}
            env.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
            for line in done.stdout.splitlines():
                if line.startswith("COST "):
                    name, value = line[5:].rsplit("\t", 1)
                    rows.setdefault(name, []).append(float(value))
            if done.returncode:
                print(done.stderr[-2000:])
    print(
        f"{args.model} {args.side}², batch {args.batch}, one process, TF-CPU, {args.repeats} "
        f"processes each; load average {min(loads):.1f}-{max(loads):.1f}\n"
    )
    print("| what | seconds (median; each process) |\n|---|---|")
    for name, values in rows.items():
        each = " ".join(f"{v:.3f}" for v in values)
        print(f"| {name} | {statistics.median(values):.3f} ({each}) |")
    shutil.rmtree(tempfile.gettempdir() + "/bench_ops_", ignore_errors=True)


if __name__ == "__main__":
    main()
