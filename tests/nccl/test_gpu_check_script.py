"""scripts/gpu_check.py's plumbing without a GPU: its NCCL job (rank processes, rings, the
summary tf_otel's reader makes of them) and its NVML step, on the stand-in torch / pynvml of
tests/nccl/standins (the real plugin is called as NCCL 2.28.9 called it on an H100)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from nccl_driver import ROOT, build_plugin

STANDINS = Path(__file__).parent / "standins"
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=f"{STANDINS}{os.pathsep}{ROOT}")
    env.pop("NCCL_PROFILER_PLUGIN", None)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )


def test_nccl_step_runs_the_ranks_and_reads_their_rings(tmp_path):
    so = build_plugin(tmp_path)
    out = tmp_path / "out"
    _run("nccl", "--plugin", str(so), "--world", "1", "2", "--ops", "40", "--out", str(out))
    res = json.loads((out / "nccl_run.json").read_text())
    assert res["world1"]["returncodes"] == [0]
    (w1,) = res["world1"]["rings"].values()
    assert w1["collectives"] == 0 and w1["header"]["api_version"] == 5
    w2 = res["world2"]
    assert w2["returncodes"] == [0, 0] and w2["two_ranks_on_one_gpu"] == "one NCCL_HOSTID per rank"
    assert len(w2["rings"]) == 2
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from gpu_check import ops_plan
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    want = Counter(f"nccl.{p['coll']}" for p in ops_plan(40, 2))
    for ring in w2["rings"].values():
        assert ring["collectives"] == 40 and ring["raw_records"] == 80  # Coll stop, last child
        assert ring["by_coll"] == dict(want) and ring["timing"] == {"execution": 40}
        assert ring["header"]["api_version"] == 5 and ring["lost"] == 0
    for r in (0, 1):
        issued = json.loads((out / "nccl_w2" / f"rank{r}.json").read_text())["issued"]
        assert [p["coll"] for p in issued] == [p["coll"] for p in ops_plan(40, 2)]


def test_nvml_step_samples_through_gpu_metrics_and_the_otel_sdk(tmp_path):
    _run("nvml", "--out", str(tmp_path), "--idle", "0.3", "--load", "0.3")
    res = json.loads((tmp_path / "nvml.json").read_text())
    assert res["sampler"] and res["errors"] == 0 and len(res["samples"]) >= 5
    assert [p["phase"] for p in res["phases"]] == ["idle_before", "matmul_load", "idle_after"]
    metrics = {p["metric"] for p in res["collections"][0]["points"]}
    assert len(metrics) == 6 and "hw.gpu.utilization" in metrics
    assert res["device_attrs"][0]["hw.name"] == "Stand-in GPU"
