#!/usr/bin/env python3
"""TensorFlow on a lent GPU machine: tf_otel's GPU paths inside a real TF GPU job.

Run by scripts/gpu_tf_check.sh, which unpacks the carried TensorFlow (scripts/gpu_tf_pack.sh
made it here: the machine has no TensorFlow and no network) and gives each step its own time
limit. Subcommands, each writing under --out:

  libs     the CUDA 12 names TF opens (libcudart.so.12 ...) as links to what the machine has
           (its CUDA 13 wheels; the carried CUDA 12 runtime and CUPTI): prints LD_LIBRARY_PATH
  probe    import TF, list GPUs, a matmul and a conv on GPU:0 against the CPU: probe.json
  train    the user's program: a keras.applications model (or an MLP) fit on synthetic data,
           optionally input-bound (--input-sleep-ms), per-step times (--timing), an XSpace of
           two steps (--xspace, without tf_otel)
  traced   ``train`` under TF_OTEL_ENABLED=1 with op detail, resources and NVML every step,
           and the same job made input-bound (the injected fault): spans, stdout
  cost     ``train`` with tracing off / defaults / op detail, interleaved rounds: cost.json
  mwms     two MultiWorkerMirroredStrategy workers on the one GPU, NCCL all-reduce
           (each worker its own NCCL_HOSTID), tf_otel with the NCCL profiler plugin
  worker   one MWMS worker (started by ``mwms``)

Without a GPU the train / traced / cost / mwms plumbing runs on the CPU (``--device cpu``:
tests/nccl/test_gpu_tf_check_script.py), so the script does not rot between GPU machines.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from gpu_common import free_port, log, write_json

ROOT = Path(__file__).resolve().parents[1]
HERE = str(Path(__file__).resolve())

# CUDA 12 names TF 2.21 opens -> the CUDA 13 library standing in for it (same API for what
# TF calls; cuFFT / cuSOLVER / cuSPARSE / cuRAND only need to open for TF to register the GPU)
CU12_NAMES = {
    "libcublas.so.12": "libcublas.so.13",
    "libcublasLt.so.12": "libcublasLt.so.13",
    "libcufft.so.11": "libcufft.so.12",
    "libcusolver.so.11": "libcusolver.so.12",
    "libcusparse.so.12": "libcusparse.so.12",
    "libcurand.so.10": "libcurand.so.10",
    "libnvJitLink.so.12": "libnvJitLink.so.13",
    "libnvrtc.so.12": "libnvrtc.so.13",
    "libcudnn.so.9": "libcudnn.so.9",
    "libnccl.so.2": "libnccl.so.2",
}
CARRIED = ("libcudart.so.12", "libcupti.so.12")  # real CUDA 12 builds, from the carried wheels
# never called by a Keras model: an empty library of that name stands in where none is found
OPEN_ONLY = {"libcufft.so.11", "libcusolver.so.11", "libcusparse.so.12", "libcurand.so.10"}


# ---------------------------------------------------------------- libs
def cmd_libs(args: argparse.Namespace) -> None:
    """Link the names TF opens into args.dir; print the LD_LIBRARY_PATH to use."""
    link_dir = Path(args.dir)
    link_dir.mkdir(parents=True, exist_ok=True)
    found: Dict[str, str] = {}
    roots = [p for p in args.search.split(":") if p]
    for root in roots:
        for path in glob.glob(os.path.join(root, "**", "lib*.so*"), recursive=True):
            found.setdefault(os.path.basename(path), path)
    dirs: List[str] = [str(link_dir)]
    made = {}
    for name in CARRIED:
        if name in found:
            made[name] = found[name]
    for want, have in CU12_NAMES.items():
        if have in found:
            made[want] = found[have]
    for want, target in made.items():
        link = link_dir / want
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
        d = os.path.dirname(target)
        if d not in dirs:
            dirs.append(d)  # cuDNN opens its sub-libraries by name; cuBLAS finds cuBLASLt
    missing = sorted((set(CU12_NAMES) | set(CARRIED)) - set(made))
    empty = []
    for name in OPEN_ONLY & set(missing):  # TF registers the GPU only once these open
        target = link_dir / name
        r = subprocess.run(["gcc", "-shared", "-o", str(target), "-x", "c", "/dev/null"])
        if r.returncode == 0:
            empty.append(name)
    info = {"links": made, "missing": missing, "empty_stand_ins": empty, "dirs": dirs}
    write_json(Path(args.out) / "libs.json", info)
    print(":".join(dirs))


# ---------------------------------------------------------------- probe
def loaded_libs() -> List[str]:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if ".so" in line}
    except OSError:
        return []
    keys = ("cud", "cubl", "cufft", "cusolver", "cusparse", "curand", "cupti", "nccl", "nvJit")
    return sorted(p for p in paths if any(k in os.path.basename(p) for k in keys))


def rel_err(a: Any, b: Any) -> float:
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def cmd_probe(args: argparse.Namespace) -> None:
    t0 = time.time()
    info: Dict[str, Any] = {"python": sys.version}
    import numpy as np
    import tensorflow as tf

    info["import_s"] = round(time.time() - t0, 2)
    info["tf"] = tf.__version__
    info["build_info"] = dict(tf.sysconfig.get_build_info())
    gpus = tf.config.list_physical_devices("GPU")
    info["gpus"] = [g.name for g in gpus]
    out = Path(args.out)
    rc = 2
    if gpus:
        try:
            info["gpu_details"] = tf.config.experimental.get_device_details(gpus[0])
        except Exception as e:  # noqa: BLE001
            info["gpu_details"] = repr(e)
        rng = np.random.default_rng(0)
        a = rng.standard_normal((512, 512)).astype("float32")
        b = rng.standard_normal((512, 512)).astype("float32")
        try:
            t = time.time()
            with tf.device("/GPU:0"):
                got = tf.matmul(a, b).numpy()
            info["matmul_s"] = round(time.time() - t, 3)
            info["matmul_rel_err"] = rel_err(got, a.astype(np.float64) @ b)
            rc = 3
        except Exception as e:  # noqa: BLE001
            info["matmul_error"] = repr(e)
        x = rng.standard_normal((8, 32, 32, 16)).astype("float32")
        k = rng.standard_normal((3, 3, 16, 32)).astype("float32")
        try:
            t = time.time()
            with tf.device("/CPU:0"):
                ref = tf.nn.conv2d(x, k, 1, "SAME").numpy()
            with tf.device("/GPU:0"):
                got = tf.nn.conv2d(x, k, 1, "SAME").numpy()
            info["conv_s"] = round(time.time() - t, 3)
            info["conv_rel_err"] = rel_err(got, ref)
            if rc == 3 and info["matmul_rel_err"] < 1e-2 and info["conv_rel_err"] < 1e-2:
                rc = 0
        except Exception as e:  # noqa: BLE001
            info["conv_error"] = repr(e)
        try:
            info["memory_info"] = tf.config.experimental.get_memory_info("GPU:0")
        except Exception as e:  # noqa: BLE001
            info["memory_info"] = repr(e)
    info["loaded_libs"] = loaded_libs()
    if not gpus:  # which of the names TF opens fail here, and why
        import ctypes

        opened = {}
        for name in (*CARRIED, *CU12_NAMES):
            try:
                ctypes.CDLL(name)
                opened[name] = "ok"
            except OSError as e:
                opened[name] = str(e)
        info["dlopen"] = opened
    info["rc"] = rc
    log(json.dumps(info, indent=1, default=str))
    write_json(out / "probe.json", info)
    sys.exit(rc)


# ---------------------------------------------------------------- train (the user's program)
def cmd_train(args: argparse.Namespace) -> None:
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import numpy as np
    import tensorflow as tf

    keras = tf.keras
    if args.model == "mlp":
        model = keras.Sequential(
            [
                keras.Input((args.size * args.size * 3,)),
                keras.layers.Dense(2048, activation="relu"),
                keras.layers.Dense(2048, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        shape: tuple = (args.size * args.size * 3,)
    else:
        app = getattr(keras.applications, args.model)
        model = app(weights=None, input_shape=(args.size, args.size, 3), classes=10)
        shape = (args.size, args.size, 3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, *shape)).astype("float32")
    y = rng.integers(0, 10, size=(args.batch,)).astype("int64")
    data = tf.data.Dataset.from_tensors((x, y)).repeat()
    if args.input_sleep_ms > 0:  # the injected fault: a slow input stage
        sleep_s = args.input_sleep_ms / 1000.0

        def slow(a: Any, b: Any) -> Any:
            def wait(v: Any) -> Any:
                time.sleep(sleep_s)
                return v

            slowed = tf.py_function(wait, [a], tf.float32)
            slowed.set_shape(a.shape)
            return slowed, b

        data = data.map(slow)
    data = data.prefetch(1)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    times: List[List[int]] = []

    class Timing(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            times.append([time.time_ns(), 0])

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            times[-1][1] = time.time_ns()

    callbacks: List[Any] = [Timing()]
    if args.xspace:

        class Profile(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
                if batch == args.steps - 3:
                    tf.profiler.experimental.start(args.xspace)

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if batch == args.steps - 2:
                    tf.profiler.experimental.stop()

        callbacks.append(Profile())
    t0 = time.time()
    model.fit(data, epochs=1, steps_per_epoch=args.steps, verbose=0, callbacks=callbacks)
    wall = time.time() - t0
    gpu_peak = None
    try:
        if tf.config.list_physical_devices("GPU"):
            gpu_peak = tf.config.experimental.get_memory_info("GPU:0")["peak"]
    except Exception:  # noqa: BLE001
        pass
    result = {
        "steps": args.steps,
        "fit_s": round(wall, 3),
        "step_ns": [e - b for b, e in times],
        "begin_ns": [b for b, _ in times],
        "gpu_peak_bytes_program": gpu_peak,
        "tf_otel": os.environ.get("TF_OTEL_ENABLED", ""),
        "pid": os.getpid(),
    }
    if args.timing:
        Path(args.timing).write_text(json.dumps(result))
    print("TRAIN_DONE", json.dumps({k: v for k, v in result.items() if k != "begin_ns"}))


# ---------------------------------------------------------------- traced runs
TRACED_ENV = {
    "TF_OTEL_ENABLED": "1",
    "TF_OTEL_OPS_EVERY": "10",
    "TF_OTEL_RESOURCES_EVERY": "10",
    "TF_OTEL_GPU_METRICS_INTERVAL_S": "0.1",
    "OTEL_TRACES_EXPORTER": "none",
    "OTEL_METRICS_EXPORTER": "none",
    "OTEL_LOGS_EXPORTER": "none",
}


def run_train(
    args: argparse.Namespace,
    extra: List[str],
    env_extra: Dict[str, str],
    log_path: Path,
    timeout: float,
) -> Dict[str, Any]:
    env = dict(os.environ, **env_extra)
    cmd = [sys.executable, HERE, "train", "--device", args.device, "--model", args.model,
           "--size", str(args.size), "--batch", str(args.batch), *extra]  # fmt: skip
    t = time.time()
    with open(log_path, "w") as f:
        try:
            p = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = -9
    return {"rc": rc, "wall_s": round(time.time() - t, 2), "cmd": " ".join(cmd[2:])}


def cmd_traced(args: argparse.Namespace) -> None:
    out = Path(args.out)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    runs = {}
    for name, sleep_ms in (("compute", 0), ("input_bound", args.input_sleep_ms)):
        d = work / name
        d.mkdir()
        env = dict(TRACED_ENV, TF_OTEL_FILE=str(d / "spans-{rank}.jsonl"))
        env["TF_OTEL_JOB_ID"] = f"gpu-{name}"
        extra = ["--steps", str(args.steps), "--timing", str(d / "timing.json")]
        if sleep_ms:
            extra += ["--input-sleep-ms", str(sleep_ms)]
        runs[name] = run_train(args, extra, env, d / "stdout.log", args.timeout)
        log(name, runs[name])
    (work / "runs.json").write_text(json.dumps(runs, indent=1))
    with tarfile.open(out / "traced.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="traced")
    log("wrote", out / "traced.tar.gz", (out / "traced.tar.gz").stat().st_size, "bytes")


def cmd_xspace(args: argparse.Namespace) -> None:
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    extra = ["--steps", "6", "--xspace", str(work / "logdir")]
    r = run_train(args, extra, {"TF_OTEL_ENABLED": "0"}, work / "stdout.log", args.timeout)
    log("xspace run", r)
    found = glob.glob(str(work / "logdir" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    if found:
        import gzip

        dest = Path(args.out) / "tf_gpu.xplane.pb.gz"
        with open(found[0], "rb") as src, gzip.open(dest, "wb") as gz:
            shutil.copyfileobj(src, gz)
        log("wrote", dest, dest.stat().st_size, "bytes")
    else:
        log("no xplane.pb written:", (work / "stdout.log").read_text()[-3000:])


def cmd_cost(args: argparse.Namespace) -> None:
    out = Path(args.out)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    variants = {
        "off": {"TF_OTEL_ENABLED": "0"},
        "defaults": {"TF_OTEL_ENABLED": "1", "OTEL_TRACES_EXPORTER": "none",
                     "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"},
        "detail": dict(TRACED_ENV),
    }  # fmt: skip
    rows: List[Dict[str, Any]] = []
    deadline = time.time() + args.budget_s
    for rnd in range(args.rounds):
        for name, env in variants.items():
            if time.time() > deadline:
                log("cost: budget spent before round", rnd, name)
                break
            d = work / f"{rnd}_{name}"
            d.mkdir()
            env = dict(env, TF_OTEL_FILE=str(d / "spans-{rank}.jsonl"))
            if name == "off":
                env.pop("TF_OTEL_FILE")
            timing = d / "timing.json"
            extra = ["--steps", str(args.steps), "--timing", str(timing)]
            r = run_train(args, extra, env, d / "stdout.log", args.timeout)
            row: Dict[str, Any] = {"round": rnd, "variant": name, **r}
            if timing.exists():
                t = json.loads(timing.read_text())
                steady = t["step_ns"][args.warmup :]
                row["median_step_ms"] = statistics.median(steady) / 1e6 if steady else None
                row["steps_timed"] = len(steady)
                row["step_ms_all"] = [round(s / 1e6, 3) for s in t["step_ns"]]
            log("cost", {k: v for k, v in row.items() if k != "step_ms_all"})
            rows.append(row)
            write_json(out / "cost.json", {"rows": rows, "model": args.model})  # if cut short
    summary: Dict[str, Any] = {}
    for name in variants:
        meds = [
            r["median_step_ms"] for r in rows if r["variant"] == name and r.get("median_step_ms")
        ]
        summary[name] = {"median_of_runs_ms": statistics.median(meds) if meds else None,
                         "runs_ms": meds}  # fmt: skip
    write_json(out / "cost.json", {"rows": rows, "summary": summary, "model": args.model,
                                   "batch": args.batch, "size": args.size})  # fmt: skip
    log("cost summary", json.dumps(summary))


# ---------------------------------------------------------------- MWMS on the one GPU
def cmd_worker(args: argparse.Namespace) -> None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 3 cannot fit under MWMS
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import numpy as np
    import tensorflow as tf
    import tf_keras

    impl = tf.distribute.experimental.CommunicationImplementation
    comm = impl.RING if args.device == "cpu" else impl.NCCL
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=comm)
    )
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    rng = np.random.default_rng(int(task["index"]))
    x = rng.standard_normal((64, 256)).astype("float32")
    y = rng.standard_normal((64, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    with strategy.scope():
        model = tf_keras.Sequential(
            [
                tf_keras.layers.Dense(1024, activation="relu", input_shape=(256,)),
                tf_keras.layers.Dense(1024, activation="relu"),
                tf_keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=tf_keras.optimizers.SGD(0.01), loss="mse")
    model.fit(data.with_options(options), epochs=1, steps_per_epoch=args.steps, verbose=0)
    print(f"worker {task['index']} done", flush=True)


def cmd_mwms(args: argparse.Namespace) -> None:
    out = Path(args.out)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    (work / "spans").mkdir(parents=True)
    (work / "rings").mkdir()
    ports = [free_port() for _ in range(2)]
    coordinator = free_port()
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for i in range(2):
        env = dict(
            os.environ,
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
            TF_OTEL_ENABLED="1",
            TF_OTEL_FILE=str(work / "spans" / "spans-{rank}.jsonl"),
            TF_OTEL_COORDINATOR=f"127.0.0.1:{coordinator}",
            TF_OTEL_COLLECTIVE_EVERY="2",
            TF_OTEL_NCCL_PROFILER="1",
            TF_OTEL_NCCL_RING_DIR=str(work / "rings"),
            TF_OTEL_GPU_METRICS_INTERVAL_S="0.2",
            TF_FORCE_GPU_ALLOW_GROWTH="true",
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            # two "hosts": NCCL refuses two ranks of one communicator on one GPU of a host
            NCCL_HOSTID=f"tf_otel_gpu_tf_check_worker{i}",
            NCCL_SOCKET_IFNAME="lo",
            NCCL_IB_DISABLE="1",
            NCCL_DEBUG="INFO",
            NCCL_DEBUG_SUBSYS="INIT,ENV,NET,PROFILE",
        )
        cmd = [sys.executable, HERE, "worker", "--device", args.device, "--steps", str(args.steps)]
        f = open(work / f"worker{i}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT), f))
    deadline = time.time() + args.timeout
    rcs = []
    for p, f in procs:
        try:
            rcs.append(p.wait(timeout=max(1.0, deadline - time.time())))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append(-9)
        f.close()
    (work / "rcs.json").write_text(json.dumps(rcs))
    log("mwms rcs", rcs)
    with tarfile.open(out / "mwms.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="mwms")
    log("wrote", out / "mwms.tar.gz", (out / "mwms.tar.gz").stat().st_size, "bytes")


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("libs")
    s.add_argument("--dir", default="/tmp/tfcuda")
    s.add_argument("--search", required=True, help="':'-separated roots to search for libraries")
    s.add_argument("--out", required=True)
    s = sub.add_parser("probe")
    s.add_argument("--out", required=True)
    for name in ("train", "traced", "xspace", "cost", "mwms", "worker"):
        s = sub.add_parser(name)
        s.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
        s.add_argument("--steps", type=int, default=40)
        s.add_argument("--model", default="ResNet50", help="a keras.applications name, or mlp")
        s.add_argument("--size", type=int, default=128, help="image side")
        s.add_argument("--batch", type=int, default=64)
        s.add_argument("--timeout", type=float, default=120.0)
        s.add_argument("--out", default=".")
        s.add_argument("--work", default=f"/tmp/tf_otel_gpu_tf_{name}")
        if name == "train":
            s.add_argument("--timing", default="")
            s.add_argument("--xspace", default="")
            s.add_argument("--input-sleep-ms", type=float, default=0.0)
        if name == "traced":
            s.add_argument("--input-sleep-ms", type=float, default=60.0)
        if name == "cost":
            s.add_argument("--rounds", type=int, default=3)
            s.add_argument("--warmup", type=int, default=10)
            s.add_argument("--budget-s", type=float, default=150.0)
    args = p.parse_args(argv)
    if hasattr(args, "out"):
        Path(args.out).mkdir(parents=True, exist_ok=True)
    globals()["cmd_" + args.cmd](args)


if __name__ == "__main__":
    main()
