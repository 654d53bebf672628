#!/usr/bin/env python3
"""GPU-side checks of tf_otel on a machine with one NVIDIA GPU and no TensorFlow.

Run by scripts/gpu_check.sh (which builds the NCCL plugin and gives each step its own time
limit); each subcommand is independent and writes JSON under --out:

  env     versions: GPU, driver, CUDA, torch, NCCL (torch.cuda.nccl.version()), jax, pynvml
  nccl    a torch.distributed NCCL job (world 1 and/or 2 processes on the one GPU) with the
          tf_otel NCCL profiler plugin: the rings it wrote, the collectives issued, NCCL's log
  nvml    tf_otel.metrics.gpu_metrics sampling NVML while idle / under a matmul load / idle
  xplane  a JAX profiler capture (the same XSpace format as TF's) of a few jitted GPU ops
  bench   all_reduce loops with the plugin loaded vs not, interleaved rounds

Two ranks on one GPU: NCCL refuses two ranks of one communicator on one device of one host,
so each rank gets its own NCCL_HOSTID: NCCL then sees two "nodes" of one GPU each and connects
them over its socket transport on the loopback interface (NCCL_SOCKET_IFNAME=lo), which also
exercises the proxy thread's events. The two processes' kernels time-share the GPU.

Without a GPU: tests/nccl/test_gpu_check_script.py runs the nccl and nvml steps on the stand-in
torch / pynvml of tests/nccl/standins (PYTHONPATH=tests/nccl/standins:.). ``--device cpu``
(gloo, no NCCL) is untried.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import gzip
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

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpu_common import free_port, log, write_json  # noqa: E402

NCCL_ENV = {
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,ENV,NET,PROFILE",
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_IB_DISABLE": "1",
}


LOG_WORDS = ("PROFILER", "rofiler", "NCCL version", "WARN", "Error", "NET/", "HOSTID", "Traceback")


def nccl_version(torch: Any) -> str:
    v = torch.cuda.nccl.version()
    if isinstance(v, int):  # older torch: NCCL_VERSION_CODE, e.g. 22809 or 2708
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 10000 else str(v)
    return ".".join(map(str, v))


# ---------------------------------------------------------------- env
def cmd_env(args: argparse.Namespace) -> None:
    info: Dict[str, Any] = {"python": sys.version, "time_ns": time.time_ns()}
    try:
        q = "name,driver_version,memory.total,pci.bus_id,compute_cap,power.limit"
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except Exception as e:
        info["nvidia_smi"] = f"error: {e}"
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["device_name"] = torch.cuda.get_device_name(0)
            info["nccl_version"] = nccl_version(torch)
    except Exception as e:
        info["torch_error"] = repr(e)
    for mod in ("jax", "jaxlib", "pynvml", "cupy", "google.protobuf", "wrapt"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            info[mod] = getattr(m, "__version__", "?")
        except Exception as e:
            info[mod] = f"missing: {e!r}"
    try:
        import pynvml

        pynvml.nvmlInit()
        info["nvml_driver"] = pynvml.nvmlSystemGetDriverVersion()
        info["nvml_cuda_driver"] = pynvml.nvmlSystemGetCudaDriverVersion()
        pynvml.nvmlShutdown()
    except Exception as e:
        info["nvml_error"] = repr(e)
    libs = glob.glob(str(Path(sys.prefix) / "lib/python3*/site-packages/nvidia/nccl/lib/*"))
    info["nccl_libs"] = libs
    log(json.dumps(info, indent=1, default=str))
    write_json(Path(args.out) / "env.json", info)


# ---------------------------------------------------------------- nccl rank job
def ops_plan(n: int, world: int) -> List[Dict[str, Any]]:
    """The collectives a rank issues, in order (the same on every rank)."""
    dtypes = ["float32", "bfloat16", "float16", "int32", "float64", "int8"]
    sizes = [1, 255, 4096, 65536, 262144, 1 << 20]  # elements per rank
    colls = ["AllReduce", "AllReduce", "AllGather", "Broadcast", "ReduceScatter"]
    plan = []
    for i in range(n):
        coll = colls[i % len(colls)]
        dtype = dtypes[(i // len(colls)) % len(dtypes)]
        size = sizes[(i // (len(colls) * len(dtypes))) % len(sizes)]
        if size >= 262144 and dtype in ("float64",):
            size = 65536
        op = "sum"
        if coll in ("AllReduce", "ReduceScatter") and i % 7 == 3:
            op = "max"
        plan.append(
            {"i": i, "coll": coll, "dtype": dtype, "count": size, "op": op, "root": i % world}
        )
    return plan


def cmd_rank(args: argparse.Namespace) -> None:
    """One rank of the NCCL job (started by ``nccl`` / ``bench`` with RANK etc. in env)."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.pin and hasattr(os, "sched_setaffinity"):  # 4 cores a rank: less jitter in timings
        cores = sorted(os.sched_getaffinity(0))
        mine = set(cores[4 * rank + 2 : 4 * rank + 6])
        if len(mine) == 4:
            os.sched_setaffinity(0, mine)
    cpu = args.device == "cpu"
    dev = torch.device("cpu") if cpu else torch.device("cuda", 0)
    if not cpu:
        torch.cuda.set_device(0)
    t_init = time.time_ns()
    kw: Dict[str, Any] = {} if cpu else {"device_id": dev}
    dist.init_process_group(
        "gloo" if cpu else "nccl",
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        **kw,
    )
    out: Dict[str, Any] = {
        "rank": rank,
        "world": world,
        "pid": os.getpid(),
        "mode": args.mode,
        "init_start_ns": t_init,
        "init_end_ns": time.time_ns(),
        "nccl_env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TF_OTEL"))},
    }
    if not cpu:
        out["nccl_version"] = nccl_version(torch)
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    red = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
    if args.mode == "functional":
        plan = ops_plan(args.ops, world)
        bufs = {}
        for p in plan:
            key = (p["coll"], p["dtype"], p["count"])
            if key in bufs:
                continue
            dt = getattr(torch, p["dtype"])
            n = p["count"]
            inp = torch.ones(
                n * (world if p["coll"] == "ReduceScatter" else 1), dtype=dt, device=dev
            )
            outp = (
                torch.empty(n * world, dtype=dt, device=dev) if p["coll"] == "AllGather" else None
            )
            if p["coll"] == "ReduceScatter":
                outp = torch.empty(n, dtype=dt, device=dev)
            bufs[key] = (inp, outp)
        sync()
        issued = []
        prof = None
        if args.profile_kernels and not cpu:  # CUPTI (through torch's Kineto): real NCCL kernels
            try:
                from torch.profiler import ProfilerActivity, profile

                prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                prof.__enter__()
            except Exception as e:
                prof = None
                out["kineto_error"] = repr(e)
        t0 = time.time_ns()
        for p in plan:
            inp, outp = bufs[(p["coll"], p["dtype"], p["count"])]
            ts = time.time_ns()
            if p["coll"] == "AllReduce":
                dist.all_reduce(inp, op=red[p["op"]])
            elif p["coll"] == "AllGather":
                dist.all_gather_into_tensor(outp, inp)
            elif p["coll"] == "Broadcast":
                dist.broadcast(inp, src=p["root"])
            else:
                dist.reduce_scatter_tensor(outp, inp, op=red[p["op"]])
            issued.append({**p, "issue_ns": ts, "returned_ns": time.time_ns()})
            if p["i"] % 32 == 31:
                sync()
        sync()
        out.update(ops_start_ns=t0, ops_end_ns=time.time_ns(), issued=issued)
        if prof is not None:
            try:
                prof.__exit__(None, None, None)
                trace = Path(args.out) / f"rank{rank}_trace.json"
                prof.export_chrome_trace(str(trace))
                out["kineto"] = kineto_kernels(trace)
                trace.unlink()
            except Exception as e:
                out["kineto_error"] = repr(e)
    else:  # bench: all_reduce loops, host enqueue time per call and wall time per collective
        x = torch.ones(args.count, dtype=torch.float32, device=dev)
        for _ in range(args.warmup):
            dist.all_reduce(x)
        sync()
        enq: List[int] = []
        walls: List[float] = []
        for _ in range(args.batches):
            t0 = time.perf_counter_ns()
            for _ in range(args.ops):
                a = time.perf_counter_ns()
                dist.all_reduce(x)
                enq.append(time.perf_counter_ns() - a)
            sync()
            walls.append((time.perf_counter_ns() - t0) / args.ops)
        out.update(count=args.count, enqueue_ns=enq, wall_ns_per_coll=walls)
    sync()
    dist.destroy_process_group()  # NCCL finalizes the plugin: the ring is flushed
    out["done_ns"] = time.time_ns()
    write_json(Path(args.out) / f"rank{rank}.json", out)


def kineto_kernels(path: Path) -> Dict[str, Any]:
    """The GPU kernel events (and the NCCL CPU ops) of a torch.profiler chrome trace, with the
    trace's own time base, small enough to keep as a fixture."""
    t = json.loads(path.read_text())
    keep = []
    for ev in t.get("traceEvents", []):
        cat = str(ev.get("cat", ""))
        name = str(ev.get("name", ""))
        if cat == "kernel" or (cat == "cpu_op" and ("nccl" in name or "c10d" in name)):
            args = ev.get("args", {})
            keep.append(
                {
                    "cat": cat,
                    "name": name,
                    "ts": ev.get("ts"),
                    "dur": ev.get("dur"),
                    "tid": ev.get("tid"),
                    "args": {
                        k: v
                        for k, v in args.items()
                        if k
                        in (
                            "correlation",
                            "stream",
                            "device",
                            "grid",
                            "block",
                            "External id",
                            "Collective name",
                            "dtype",
                            "In msg nelems",
                            "Out msg nelems",
                            "Process Group Name",
                            "Group size",
                            "Sequence number",
                            "Record function id",
                        )
                    },
                }
            )
    return {
        "top_level": {k: v for k, v in t.items() if k not in ("traceEvents", "deviceProperties")},
        "events": keep,
    }


def run_ranks(
    world: int,
    outdir: Path,
    mode: str,
    plugin: Optional[str],
    device: str,
    extra: List[str],
    hostid: bool,
    timeout: float,
    env_extra: Optional[Dict[str, str]] = None,
) -> Dict[str, Any]:
    """Start ``world`` rank processes of this script, wait, and return their exit codes."""
    outdir.mkdir(parents=True, exist_ok=True)
    ring_dir = outdir / "rings"
    ring_dir.mkdir(exist_ok=True)
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ)
        env.update(NCCL_ENV)
        env.update(env_extra or {})
        env.update(
            RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            TF_OTEL_NCCL_RING_DIR=str(ring_dir),
            PYTHONUNBUFFERED="1",
        )
        if plugin:
            env["NCCL_PROFILER_PLUGIN"] = plugin
        else:
            env.pop("NCCL_PROFILER_PLUGIN", None)
        if hostid and world > 1:
            env["NCCL_HOSTID"] = f"tf_otel_gpu_check_rank{r}"
        cmd = [sys.executable, __file__, "rank", "--mode", mode, "--device", device]
        cmd += ["--out", str(outdir)] + extra
        logf = open(outdir / f"rank{r}.log", "w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT), logf))
    deadline = time.monotonic() + timeout
    codes = []
    for p, f in procs:
        try:
            codes.append(p.wait(max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("timeout")
        f.close()
    return {"returncodes": codes, "ring_dir": str(ring_dir)}


def summarize_rings(ring_dir: Path) -> Dict[str, Any]:
    """What tf_otel's own reader makes of the rings (the same code the step path runs)."""
    from tf_otel.nccl.ring import RingReader

    out: Dict[str, Any] = {}
    for path in sorted(ring_dir.glob("tf_otel_nccl_*")):
        raw = RingReader.open(str(path))  # every committed record, rewrites included
        head = raw.header()
        events, lost = raw.read_new()
        raw.close()
        reader = RingReader.open(str(path))  # what the step path emits: one per collective
        recs = reader.poll(flush=True)
        reader.close()
        out[path.name] = {
            "header": head,
            "raw_records": len(events),
            "lost": lost,
            "collectives": len(recs),
            "by_coll": _count(r.name for r in recs),
            "timing": _count(str(r.attributes.get("nccl.timing")) for r in recs),
            "first": [
                {"name": r.name, "start_ns": r.start_ns, "end_ns": r.end_ns, **r.attributes}
                for r in recs[:5]
            ],
            "first_raw": [dataclasses.asdict(e) for e in events[:6]],
        }
    return out


def _count(items: Any) -> Dict[str, int]:
    d: Dict[str, int] = {}
    for x in items:
        d[x] = d.get(x, 0) + 1
    return d


def nccl_job(args: argparse.Namespace, world: int, d: Path, multi_rank_gpu: bool) -> Dict[str, Any]:
    log(f"NCCL job: world={world} ops={args.ops} plugin={args.plugin} multi_rank={multi_rank_gpu}")
    t = time.time()
    r = run_ranks(
        world,
        d,
        "functional",
        args.plugin,
        args.device,
        ["--ops", str(args.ops)] + (["--profile-kernels"] if args.profile_kernels else []),
        hostid=not multi_rank_gpu,
        timeout=args.timeout,
        env_extra={"NCCL_MULTI_RANK_GPU_ENABLE": "1"} if multi_rank_gpu else None,
    )
    r["seconds"] = round(time.time() - t, 2)
    r["two_ranks_on_one_gpu"] = (
        ("NCCL_MULTI_RANK_GPU_ENABLE=1" if multi_rank_gpu else "one NCCL_HOSTID per rank")
        if world > 1
        else None
    )
    try:
        r["rings"] = summarize_rings(Path(r["ring_dir"]))
    except Exception as e:
        r["rings_error"] = repr(e)
    brief = {k: v for k, v in r.items() if k != "rings"}
    brief["rings"] = {
        name: {k: v for k, v in ring.items() if k not in ("first", "first_raw")}
        for name, ring in r.get("rings", {}).items()
    }
    first = next(iter(r.get("rings", {}).values()), {}).get("first_raw", [])[:2]
    log(json.dumps({**brief, "first_raw_of_one_ring": first}, indent=1, default=str))
    for rank_log in sorted(d.glob("rank*.log")):
        lines = rank_log.read_text(errors="replace").splitlines()
        keep = [ln for ln in lines if any(w in ln for w in LOG_WORDS)][:16]
        if any(c != 0 for c in r["returncodes"]):
            keep += ["...", *lines[-8:]]
        log(f"{rank_log.name}: {len(lines)} lines, of which:\n  " + "\n  ".join(keep))
    return r


def cmd_nccl(args: argparse.Namespace) -> None:
    out = Path(args.out)
    res: Dict[str, Any] = {}
    dirs: List[Path] = []
    for world in args.world:
        d = out / f"nccl_w{world}"
        dirs.append(d)
        r = res[f"world{world}"] = nccl_job(args, world, d, args.multi_rank_gpu)
        if world > 1 and any(c != 0 for c in r["returncodes"]) and not args.multi_rank_gpu:
            # NCCL >= 2.30 can also put two ranks on one GPU of one host
            d = out / f"nccl_w{world}_multirank"
            dirs.append(d)
            res[f"world{world}_multirank"] = nccl_job(args, world, d, True)
    write_json(out / f"nccl_{args.tag}.json", res)
    if args.bundle:
        with tarfile.open(out / f"nccl_{args.tag}.tar.gz", "w:gz") as tar:
            for d in dirs:
                tar.add(d, arcname=d.name)
        for d in dirs:
            shutil.rmtree(d)


# ---------------------------------------------------------------- bench
def cmd_bench(args: argparse.Namespace) -> None:
    out = Path(args.out)
    rounds: List[Dict[str, Any]] = []
    multi = args.multi_rank_gpu
    for i in range(args.rounds):
        order = [args.plugin, None] if i % 2 == 0 else [None, args.plugin]
        for plugin in order:
            label = "plugin" if plugin else "none"
            d = out / f"bench_{i}_{label}"
            t = time.time()
            r = run_ranks(
                args.world,
                d,
                "bench",
                plugin,
                args.device,
                [
                    "--ops",
                    str(args.ops),
                    "--batches",
                    str(args.batches),
                    "--count",
                    str(args.count),
                ]
                + (["--pin"] if args.pin else []),
                hostid=not multi,
                timeout=args.timeout,
                env_extra={"NCCL_MULTI_RANK_GPU_ENABLE": "1"} if multi else None,
            )
            row: Dict[str, Any] = {"round": i, "variant": label, "seconds": time.time() - t, **r}
            row["two_ranks_on_one_gpu"] = "NCCL_MULTI_RANK_GPU_ENABLE=1" if multi else "NCCL_HOSTID"
            if any(c != 0 for c in r["returncodes"]) and not multi:
                multi = True  # the hostid route failed here: try NCCL >= 2.30's own for the rest
            for rank_file in sorted(d.glob("rank*.json")):
                j = json.loads(rank_file.read_text())
                enq = sorted(j["enqueue_ns"])
                row[f"rank{j['rank']}"] = {
                    "enqueue_median_us": statistics.median(enq) / 1e3,
                    "enqueue_p90_us": enq[int(0.9 * (len(enq) - 1))] / 1e3,
                    "enqueue_mean_us": statistics.mean(enq) / 1e3,
                    "wall_us_per_coll": [w / 1e3 for w in j["wall_ns_per_coll"]],
                }
            if plugin:
                try:
                    rings = summarize_rings(Path(r["ring_dir"]))
                    row["ring_collectives"] = {k: v["collectives"] for k, v in rings.items()}
                    row["ring_dropped"] = {k: v["header"]["dropped"] for k, v in rings.items()}
                except Exception as e:
                    row["rings_error"] = repr(e)
            log(json.dumps({k: v for k, v in row.items() if k != "ring_dir"}, default=str))
            rounds.append(row)
            shutil.rmtree(d, ignore_errors=True)
    summary: Dict[str, Any] = {}
    for label in ("plugin", "none"):
        rows = [r for r in rounds if r["variant"] == label]
        med = [r[k]["enqueue_median_us"] for r in rows for k in r if k.startswith("rank")]
        wall = [
            w for r in rows for k in r if k.startswith("rank") for w in r[k]["wall_us_per_coll"]
        ]
        if med:
            summary[label] = {
                "enqueue_median_us_per_rank_round": med,
                "wall_us_per_coll_per_batch": wall,
                "enqueue_median_us": statistics.median(med),
                "wall_median_us": statistics.median(wall) if wall else None,
            }
    if "plugin" in summary and "none" in summary:
        p, n = summary["plugin"], summary["none"]
        summary["enqueue_cost_us"] = p["enqueue_median_us"] - n["enqueue_median_us"]
        if p["wall_median_us"] is not None and n["wall_median_us"] is not None:
            summary["wall_cost_us"] = p["wall_median_us"] - n["wall_median_us"]
    log("bench summary:", json.dumps(summary, default=str))
    write_json(out / "bench.json", {"args": vars(args), "rounds": rounds, "summary": summary})


# ---------------------------------------------------------------- nvml
def cmd_nvml(args: argparse.Namespace) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from tf_otel.metrics import gpu_metrics as gm

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    sampler = gm.start_gpu_metrics(
        {"tf_otel.rank": 0, "tf_otel.job.id": "gpu_check"},
        interval_s=args.interval,
        meter_provider=provider,
    )
    res: Dict[str, Any] = {"interval_s": args.interval, "sampler": sampler is not None}
    if sampler is None:
        log("nvml: start_gpu_metrics returned None (no NVML / GPU)")
        write_json(Path(args.out) / "nvml.json", res)
        return
    res["device_attrs"] = sampler._device_attrs
    phases: List[Dict[str, Any]] = []
    collections: List[Dict[str, Any]] = []

    def phase(name: str, seconds: float, load: Any = None) -> None:
        t0 = time.time_ns()
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            if load is not None:
                load()
                n += 1
            else:
                time.sleep(0.02)
        t1 = time.time_ns()
        phases.append(
            {
                "phase": name,
                "start_ns": t0,
                "end_ns": t1,
                "iterations": n,
                "step_summary": sampler.step_summary(0, t0, t1),
            }
        )
        data = reader.get_metrics_data()
        points = []
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for dp in m.data.data_points:
                        points.append(
                            {
                                "metric": m.name,
                                "unit": m.unit,
                                "type": type(m.data).__name__,
                                "value": dp.value,
                                "attributes": dict(dp.attributes),
                                "scope": sm.scope.name,
                            }
                        )
        collections.append({"after_phase": name, "time_ns": time.time_ns(), "points": points})

    mats: List[Any] = []

    def matmuls() -> None:
        import torch

        for _ in range(20):
            mats[0] @ mats[1]
        torch.cuda.synchronize()

    try:
        import torch

        if torch.cuda.is_available():
            mats += [torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in "ab"]
            matmuls()
    except Exception as e:
        res["load_error"] = repr(e)
    phase("idle_before", args.idle)
    phase("matmul_load", args.load, matmuls if mats else None)
    if mats:
        mats.clear()
        torch.cuda.empty_cache()
    phase("idle_after", args.idle)
    with sampler._lock:
        ring = list(sampler._ring)
    sampler.stop()
    res.update(
        samples=[{"t_ns": t, "values": {str(k): v for k, v in vals.items()}} for t, vals in ring],
        phases=phases,
        collections=collections,
        errors=sampler.errors,
        sample_count=sampler.samples,
    )
    for p in phases:
        log("nvml phase", p["phase"], p["iterations"], p["step_summary"])
    write_json(Path(args.out) / "nvml.json", res)


# ---------------------------------------------------------------- xplane
def cmd_xplane(args: argparse.Namespace) -> None:
    import jax
    import jax.numpy as jnp

    out = Path(args.out)
    trace_dir = Path(args.trace_dir)
    shutil.rmtree(trace_dir, ignore_errors=True)
    info: Dict[str, Any] = {"jax": jax.__version__, "devices": [str(d) for d in jax.devices()]}
    key = jax.random.PRNGKey(0)
    a = jax.random.normal(key, (2048, 2048), dtype=jnp.float32)
    b = jax.random.normal(key, (2048, 2048), dtype=jnp.bfloat16)

    @jax.jit
    def matmul(x: Any) -> Any:
        return x @ x.T

    @jax.jit
    def reduce_sum(x: Any) -> Any:
        return jnp.sum(x * 2.0, axis=1)

    @jax.jit
    def softmax(x: Any) -> Any:
        return jax.nn.softmax(x.astype(jnp.float32), axis=-1)

    fns = [(matmul, a), (reduce_sum, a), (softmax, b), (matmul, b)]
    for f, x in fns:  # compile outside the trace
        f(x).block_until_ready()
    info["trace_start_ns"] = time.time_ns()
    calls = []
    with jax.profiler.trace(str(trace_dir)):
        for _ in range(args.iters):
            for f, x in fns:
                t = time.time_ns()
                f(x).block_until_ready()
                calls.append({"fn": f.__name__, "start_ns": t, "end_ns": time.time_ns()})
    info["trace_end_ns"] = time.time_ns()
    info["calls"] = calls
    files = sorted(glob.glob(str(trace_dir / "**" / "*.xplane.pb"), recursive=True))
    info["files"] = {f: os.path.getsize(f) for f in files}
    if files:
        raw = Path(files[0]).read_bytes()
        with gzip.open(out / "jax_gpu.xplane.pb.gz", "wb") as g:
            g.write(raw)
        info["xplane_bytes"] = len(raw)
        info["plane_names"] = _plane_names(raw)
    log(json.dumps({k: v for k, v in info.items() if k != "calls"}, indent=1, default=str))
    write_json(out / "xplane.json", info)


def _plane_names(raw: bytes) -> Any:
    """Plane names and line counts, read with the protobuf wire format only (no TF here)."""
    try:
        from google.protobuf.internal.decoder import _DecodeVarint  # type: ignore

        def fields(buf: bytes) -> Any:
            i = 0
            while i < len(buf):
                tag, i = _DecodeVarint(buf, i)
                fn, wt = tag >> 3, tag & 7
                if wt == 2:
                    n, i = _DecodeVarint(buf, i)
                    yield fn, buf[i : i + n]
                    i += n
                elif wt == 0:
                    v, i = _DecodeVarint(buf, i)
                    yield fn, v
                elif wt == 1:
                    yield fn, buf[i : i + 8]
                    i += 8
                elif wt == 5:
                    yield fn, buf[i : i + 4]
                    i += 4
                else:
                    return

        out = []
        for fn, plane in fields(raw):
            if fn != 1:  # XSpace.planes
                continue
            name, lines = "", []
            for pf, v in fields(plane):
                if pf == 2:
                    name = v.decode("utf-8", "replace")
                elif pf == 3:
                    lname, nev = "", 0
                    for lf, lv in fields(v):
                        if lf == 2:
                            lname = lv.decode("utf-8", "replace")
                        elif lf == 4:
                            nev += 1
                    lines.append((lname, nev))
            out.append({"plane": name, "lines": lines[:20]})
        return out
    except Exception as e:
        return repr(e)


# ---------------------------------------------------------------- main
def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("env")
    p.add_argument("--out", required=True)
    p = sub.add_parser("rank")
    p.add_argument("--mode", choices=["functional", "bench"], required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--out", required=True)
    p.add_argument("--ops", type=int, default=400)
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--count", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--profile-kernels", action="store_true")
    p.add_argument("--pin", action="store_true")
    p = sub.add_parser("nccl")
    p.add_argument("--out", required=True)
    p.add_argument("--plugin", default=None)
    p.add_argument("--world", type=int, nargs="+", default=[1, 2])
    p.add_argument("--ops", type=int, default=400)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--timeout", type=float, default=45)
    p.add_argument("--tag", default="run")
    p.add_argument("--profile-kernels", action="store_true", help="torch.profiler: CUPTI kernels")
    p.add_argument("--bundle", action="store_true", help="tar.gz the rank folders")
    p.add_argument(
        "--multi-rank-gpu",
        action="store_true",
        help="NCCL_MULTI_RANK_GPU_ENABLE=1 (NCCL >= 2.30) instead of one NCCL_HOSTID per rank",
    )
    p = sub.add_parser("bench")
    p.add_argument("--out", required=True)
    p.add_argument("--plugin", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ops", type=int, default=150)
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--count", type=int, default=1024)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--timeout", type=float, default=40)
    p.add_argument("--multi-rank-gpu", action="store_true")
    p.add_argument("--pin", action="store_true", help="each rank on 4 cores of its own")
    p = sub.add_parser("nvml")
    p.add_argument("--out", required=True)
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--idle", type=float, default=2.0)
    p.add_argument("--load", type=float, default=4.0)
    p = sub.add_parser("xplane")
    p.add_argument("--out", required=True)
    p.add_argument("--trace-dir", default="/tmp/tf_otel_jax_trace")
    p.add_argument("--iters", type=int, default=5)
    args = ap.parse_args(argv)
    {
        "env": cmd_env,
        "rank": cmd_rank,
        "nccl": cmd_nccl,
        "bench": cmd_bench,
        "nvml": cmd_nvml,
        "xplane": cmd_xplane,
    }[args.cmd](args)


if __name__ == "__main__":
    main()
