"""tf_otel inside real TensorFlow GPU jobs, on what they produced (tests/nccl/fixtures/h200/).

Recorded by scripts/gpu_tf_check.sh on one NVIDIA H200 (driver 580.159.04), TensorFlow 2.21.0
(the GPU wheel, built for CUDA 12.5) on the machine's CUDA 13 cuBLAS / cuDNN 9.19 / NCCL 2.28.9
under their CUDA 12 names (docs/guides/NCCL.md, "TensorFlow on a GPU"):

- tf_resnet50.xplane.pb.gz: TF's own profiler XSpace of a Keras 3 ResNet50 step (128 px,
  batch 64, no XLA), trimmed to 20 ms by scripts/trim_xspace.py;
- tf_resnet50_{compute,input_bound}.spans-0.jsonl.gz: the step spans tf_otel exported from that
  model, 40 steps, with op detail and resources every 10 steps and NVML every 0.1 s; the
  input-bound twin waits 60 ms a batch in a py_function (the injected fault) with prefetch(1);
  op and kernel spans left out (the analysis reads none);
- mwms_nccl.spans-{0,1}.jsonl.gz + mwms_nccl_info.log.gz: MultiWorkerMirroredStrategy, two
  workers on the one GPU (one NCCL_HOSTID each), all-reduce over NCCL with tf_otel's profiler
  plugin (TF_OTEL_NCCL_PROFILER=1), 30 steps; NCCL's INFO lines;
- probe.json, libs.json, cost_run{1,2}.json: the environment, the library links, and the
  interleaved tracing-off / on timings (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tf_otel.analysis.analyze import analyze_source
from tf_otel.analysis.load.spill import load_spilled
from tf_otel.analysis.rules.finding_figures import median
from tf_otel.analysis.rules.whole_step import step_samples
from tf_otel.record import COMPUTE, FRAMEWORK, KERNEL

H200 = Path(__file__).parent / "fixtures" / "h200"
H100 = Path(__file__).parent / "fixtures" / "h100"
SLEEP_MS = 60.0  # the injected input stage of the input-bound twin


@pytest.fixture(scope="module")
def space():
    from tf_otel.sources.xplane import parse_xspace

    return parse_xspace(gzip.decompress((H200 / "tf_resnet50.xplane.pb.gz").read_bytes()))


@pytest.fixture(scope="module")
def kernels(space):
    from tf_otel.sources.xplane_gpu import gpu_kernel_records

    return gpu_kernel_records(space, step=7)


# -- CUPTI kernels under their TF ops -----------------------------------------------------------


def test_every_kernel_of_a_tf_gpu_step_names_its_op(kernels):
    assert len(kernels) > 500
    ops = [k.attributes.get("tensorflow.op.name") for k in kernels]
    assert all(isinstance(op, str) and ":" in op and not op.startswith("XlaModule") for op in ops)
    types = Counter(op.rpartition(":")[2] for op in ops)
    assert types["Conv2D"] >= 10  # ResNet50's convolutions, through cuDNN
    assert all(k.attributes["gpu.device"] == 0 and k.category == KERNEL for k in kernels)


def test_the_host_plane_holds_no_op_event_for_the_gpu_ops(space, kernels):
    # why ops are built from kernels: TF 2.21's executor threads hold launches and allocations
    from tf_otel.sources.xplane import host_records

    host_ops = {r.name for r in host_records(space, 7) if r.category == COMPUTE}
    gpu_ops = {k.attributes["tensorflow.op.name"] for k in kernels}
    assert len(gpu_ops) > 300 and not host_ops & gpu_ops


def test_kernels_are_grouped_under_the_op_that_launched_them(kernels):
    from tf_otel.sources.gpu_ops import group_kernels_by_op

    records = group_kernels_by_op([_copy(k) for k in kernels], step=7)
    ops = {r.record_id: r for r in records if r.category == COMPUTE}
    grouped = [r for r in records if r.category == KERNEL]
    assert len(grouped) == len(kernels) and all(k.parent_id in ops for k in grouped)
    per_op: Dict[int, List[Any]] = defaultdict(list)
    for k in grouped:
        op = ops[k.parent_id]
        assert op.start_ns <= k.start_ns and k.end_ns <= op.end_ns
        assert k.attributes["tensorflow.op.name"] == op.name
        per_op[op.record_id].append(k)
    for op in ops.values():
        name, kind = op.name.rpartition(":")[::2]
        assert op.attributes["tensorflow.op.name"] == name
        assert op.attributes["tensorflow.op.type"] == kind
        assert op.attributes["tensorflow.device"] == "/device:GPU:0"
        assert op.start_ns == min(k.start_ns for k in per_op[op.record_id])
        assert op.end_ns == max(k.end_ns for k in per_op[op.record_id])
    # runs of one op on one stream never overlap the next op's
    by_stream = sorted(ops.values(), key=lambda r: (r.attributes["gpu.stream"], r.start_ns))
    for a, b in zip(by_stream, by_stream[1:]):
        if a.attributes["gpu.stream"] == b.attributes["gpu.stream"]:
            assert a.end_ns <= b.start_ns
    assert max(len(ks) for ks in per_op.values()) >= 2  # cuDNN convolutions launch several


def test_xla_kernels_keep_no_op_group():
    # control: JAX's (XLA's) kernels carry tf_op "XlaModule:", no TF op: nothing is grouped
    from tf_otel.sources.gpu_ops import group_kernels_by_op
    from tf_otel.sources.xplane_gpu import gpu_kernel_records

    jax = gpu_kernel_records(gzip.decompress((H100 / "jax_gpu.xplane.pb.gz").read_bytes()))
    records = group_kernels_by_op(jax)
    assert records == jax and all(r.parent_id is None for r in records)


def test_the_op_cap_keeps_ops_and_kernels_of_the_ops_it_kept(kernels):
    from tf_otel.sources.gpu_ops import cap_op_tree, group_kernels_by_op

    records = group_kernels_by_op([_copy(k) for k in kernels], step=7)
    kept = cap_op_tree(records, 100, step=7)
    summary, rest = kept[0], kept[1:]
    assert summary.category == FRAMEWORK
    ops = {r.record_id for r in rest if r.category == COMPUTE}
    children = [r for r in rest if r.category == KERNEL]
    assert len(ops) == 50 and len(children) == 50
    assert all(k.parent_id in ops for k in children)
    assert summary.attributes["tf_otel.ops.total"] == len(records)
    assert summary.attributes["tf_otel.ops.kept"] == 100
    longest = sorted((r for r in records if r.category == COMPUTE), key=_length)[-50:]
    assert {r.record_id for r in longest} == ops


def test_a_profile_dir_of_a_gpu_step_becomes_op_spans_with_kernels(tmp_path):
    # the step path's converter (instrument/ops/hook.xspace_records) on the real capture
    from tf_otel.instrument.ops.hook import xspace_records

    profile = tmp_path / "plugins" / "profile" / "run"
    profile.mkdir(parents=True)
    raw = gzip.decompress((H200 / "tf_resnet50.xplane.pb.gz").read_bytes())
    (profile / "host.xplane.pb").write_bytes(raw)
    out = xspace_records(str(tmp_path), 7, 500, 0)
    ids = {r.record_id for r in out}
    kinds = Counter(r.category for r in out)
    assert kinds[COMPUTE] >= 240 and kinds[KERNEL] >= 240
    assert all(r.parent_id in ids for r in out if r.category == KERNEL)
    gpu_ops = [r for r in out if r.attributes.get("tensorflow.device") == "/device:GPU:0"]
    assert gpu_ops and all(r.category == COMPUTE for r in gpu_ops)


# -- the analysis of the traced runs: injected input stall, and the run without it -------------


def _analysis(name: str) -> Any:
    path = str(H200 / f"tf_resnet50_{name}.spans-0.jsonl.gz")
    with load_spilled([path], progress=False, workers=1) as source:
        return analyze_source(source)


def test_the_input_bound_twin_is_found_input_bound_with_an_idle_gpu():
    result = _analysis("input_bound")
    found = {f.rule: f for f in result.findings}
    stats = found["input_bound"].evidence["by_rank"]["0"]
    # prefetch(1): the 60 ms stage runs beside the step's own work (the twin without the stall:
    # its median step), so a step lasts ~60 ms and waits ~60 ms less that work
    own_ms = median([s.duration_ns / 1e6 for s in step_samples(_analysis("compute"))])
    assert 0.95 * SLEEP_MS <= stats["step_ms"] <= 1.15 * SLEEP_MS
    truth = SLEEP_MS - own_ms
    assert truth - 5 <= stats["median_wait_per_step_ms"] <= truth + 5
    assert found["low_gpu_utilization"].evidence["by_rank"]["0"]["p95_percent"] < 70
    # the stage is a sleep, not a read: 6.4 MiB read in step 1 must not make it I/O
    assert "decode_bound_input" in found and "io_bound_input" not in found


def test_the_run_without_the_stall_finds_neither():
    # control: no input finding, and no low_gpu_utilization (its NVML readings alternate
    # between ~30 % and 69-80 % in ~0.2 s blocks: p95 80 %)
    result = _analysis("compute")
    found = {f.rule for f in result.findings}
    assert not {"input_bound", "io_bound_input", "decode_bound_input"} & found
    assert "low_gpu_utilization" not in found
    gpu = sorted(s.gpu_percent for s in step_samples(result) if s.gpu_percent is not None)
    assert gpu[int(0.95 * len(gpu))] >= 70


def test_step_spans_carry_nvml_allocator_and_detail_marks():
    result = _analysis("compute")
    samples = step_samples(result)
    assert sum(s.gpu_percent is not None for s in samples) >= 30
    assert all(0 <= s.gpu_percent <= 100 for s in samples if s.gpu_percent is not None)
    detail = {s.step for s in samples if s.detail}
    assert detail == {10, 20, 30}  # TF_OTEL_OPS_EVERY=10, steady steps only
    spans = _spans(H200 / "tf_resnet50_compute.spans-0.jsonl.gz")
    limit = json.loads((H200 / "probe.json").read_text())["gpu_details"]
    assert limit["device_name"] == "NVIDIA H200"
    peaks = {
        int(a["tf_otel.step"]): int(a["tf_otel.gpu.memory.peak"])
        for _, a in spans
        if "tf_otel.gpu.memory.peak" in a
    }
    assert set(peaks) == {0, 10, 20, 30}
    # step 0 builds the model and autotunes cuDNN: its peak is the largest
    assert peaks[0] > peaks[10] > 100 * 2**20 and peaks[0] < 141 * 2**30


# -- MultiWorkerMirroredStrategy over NCCL with the plugin ---------------------------------------


def test_nccl_collectives_of_both_workers_join_on_one_key():
    keys = {}
    for rank in (0, 1):
        spans = _spans(H200 / f"mwms_nccl.spans-{rank}.jsonl.gz")
        nccl = [a for name, a in spans if name.startswith("nccl.")]
        assert len(nccl) == 120  # 30 steps x 4 all-reduces
        assert {a["nccl.profiler_version"] for a in nccl} == {"5"}
        assert {a["nccl.collective"] for a in nccl} == {"AllReduce"}
        keys[rank] = {(a["nccl.comm_hash"], a["nccl.seq"], a["tf_otel.step"]) for a in nccl}
        # the gradients' all-reduce: the bytes TF's collective span names
        tf_bytes = {a["horovod.bytes"] for name, a in spans if name.startswith("tensorflow.all")}
        assert max(int(a["nccl.bytes"]) for a in nccl) == max(int(b) for b in tf_bytes)
    assert keys[0] == keys[1] and len(keys[0]) == 120
    log = gzip.decompress((H200 / "mwms_nccl_info.log.gz").read_bytes()).decode()
    assert log.count("PROFILER/Plugin: Loaded tf_otel (v5)") == 2
    assert "NCCL version 2.28.9" in log


def test_ring_collectives_go_under_tfs_collective_spans_of_their_size():
    # what the exporter does with a step's records (runtime/exporter._place_nccl), on the real
    # spans: each ring collective of a collective-detail step under the TF all-reduce of its size
    from tf_otel.record import COLLECTIVE, Record
    from tf_otel.runtime.exporter import _place_nccl

    steps: Dict[str, List[Record]] = defaultdict(list)
    for name, attrs, start, end in _spans(H200 / "mwms_nccl.spans-0.jsonl.gz", times=True):
        category = attrs.get("tf_otel.category")
        if category in (KERNEL, COLLECTIVE):
            steps[attrs["tf_otel.step"]].append(Record(name, start, end, category, None, attrs))
    placed = detailed = 0
    for records in steps.values():
        detailed += any(r.category == COLLECTIVE for r in records)
        colls = {r.record_id: r for r in records if r.category == COLLECTIVE}
        _place_nccl(records)
        for k in (r for r in records if r.category == KERNEL):
            if not colls:
                assert k.parent_id is None  # no TF collective span in the step: under the step
                continue
            parent = colls[k.parent_id]
            assert parent.attributes["horovod.bytes"] == k.attributes["nccl.bytes"]
            # the ring's end is its last child event's stop, microseconds after the kernel's end
            # and sometimes after TF's done callback: the exporter clamps it into the parent
            assert parent.start_ns <= k.start_ns and k.end_ns <= parent.end_ns + 500_000
            placed += 1
    assert placed == 4 * detailed and detailed >= 10  # 4 all-reduces a step


def test_the_recorded_costs_are_what_the_docs_say():
    cost = json.loads((H200 / "cost_run2.json").read_text())
    runs = {v: s["runs_ms"] for v, s in cost["summary"].items()}
    assert {len(r) for r in runs.values()} == {3}
    docs = (Path(__file__).parents[2] / "docs" / "BENCHMARKS.md").read_text()
    for variant in ("off", "defaults", "detail"):
        assert f"{cost['summary'][variant]['median_of_runs_ms']:.2f} ms" in docs, variant


def _copy(record: Any) -> Any:
    from dataclasses import replace

    return replace(record, attributes=dict(record.attributes))


def _length(record: Any) -> int:
    return record.end_ns - record.start_ns


def _spans(path: os.PathLike, times: bool = False) -> List[Any]:
    out: List[Any] = []
    for line in gzip.decompress(Path(path).read_bytes()).decode().splitlines():
        for rs in json.loads(line).get("resourceSpans", []):
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    attrs = {
                        a["key"]: next(iter(a["value"].values())) for a in sp.get("attributes", [])
                    }
                    if times:
                        start, end = int(sp["startTimeUnixNano"]), int(sp["endTimeUnixNano"])
                        out.append((sp["name"], attrs, start, end))
                    else:
                        out.append((sp["name"], attrs))
    return out
