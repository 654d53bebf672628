"""scripts/gpu_tf_check.py without a GPU, so it does not rot between GPU machines: the library
links it makes for TensorFlow's CUDA 12 names (a fake CUDA 13 tree), and the traced run and its
input-bound twin on the CPU (a small MLP), analysed as on the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts" / "gpu_tf_check.py")


def test_libs_links_the_cuda12_names_and_stands_in_only_for_open_only_ones(tmp_path):
    cu13 = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    cudnn = tmp_path / "site" / "nvidia" / "cudnn" / "lib"
    runtime = tmp_path / "carried" / "nvidia" / "cuda_runtime" / "lib"
    for d in (cu13, cudnn, runtime):
        d.mkdir(parents=True)
    for name in ("libcublas.so.13", "libcublasLt.so.13", "libcusolver.so.12", "libcurand.so.10"):
        (cu13 / name).write_bytes(b"")
    (cudnn / "libcudnn.so.9").write_bytes(b"")
    (runtime / "libcudart.so.12").write_bytes(b"")
    links = tmp_path / "links"
    out = subprocess.run(
        [sys.executable, SCRIPT, "libs", "--dir", str(links), "--out", str(tmp_path),
         "--search", f"{tmp_path / 'carried' / 'nvidia'}:{tmp_path / 'site' / 'nvidia'}"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    info = json.loads((tmp_path / "libs.json").read_text())
    assert os.readlink(links / "libcublas.so.12") == str(cu13 / "libcublas.so.13")
    assert os.readlink(links / "libcusolver.so.11") == str(cu13 / "libcusolver.so.12")
    assert os.readlink(links / "libcudnn.so.9") == str(cudnn / "libcudnn.so.9")
    assert os.readlink(links / "libcudart.so.12") == str(runtime / "libcudart.so.12")
    # cuFFT and cuSPARSE missing: TF only opens them, so empty libraries stand in; CUPTI,
    # NCCL, nvJitLink, NVRTC missing: reported, nothing made
    assert sorted(info["empty_stand_ins"]) == ["libcufft.so.11", "libcusparse.so.12"]
    assert not (links / "libcupti.so.12").exists() and "libcupti.so.12" in info["missing"]
    assert out.strip().splitlines()[-1].split(":")[:2] == [str(links), str(runtime)]


@pytest.mark.integration
def test_traced_run_and_its_input_bound_twin_on_the_cpu(tmp_path):
    # the injected input stage must outlast a step's compute on a slow, loaded 2-core machine
    # (an MLP step took 50-70 ms there: a 30 ms input stage was hidden by the prefetch)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run(
        [sys.executable, SCRIPT, "traced", "--device", "cpu", "--model", "mlp", "--size", "8",
         "--batch", "8", "--steps", "16", "--input-sleep-ms", "250", "--out", str(tmp_path),
         "--work", str(tmp_path / "work")],
        env=env, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    with tarfile.open(tmp_path / "traced.tar.gz") as tar:
        tar.extractall(tmp_path / "back", filter="data")
    runs = json.loads((tmp_path / "back" / "traced" / "runs.json").read_text())
    assert {name: r["rc"] for name, r in runs.items()} == {"compute": 0, "input_bound": 0}
    from tf_otel.analysis.analyze import analyze_source
    from tf_otel.analysis.load.spill import load_spilled

    found = {}
    for name in runs:
        spans = tmp_path / "back" / "traced" / name / "spans-0.jsonl"
        with load_spilled([str(spans)], progress=False, workers=1) as source:
            found[name] = {f.rule for f in analyze_source(source).findings}
        timing = json.loads((spans.parent / "timing.json").read_text())
        assert len(timing["step_ns"]) == 16
    assert "input_bound" in found["input_bound"] and "input_bound" not in found["compute"]
