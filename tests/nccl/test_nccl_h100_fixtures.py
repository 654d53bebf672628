"""tf_otel's GPU-side readers on what a real GPU produced (tests/nccl/fixtures/h100/).

Recorded by scripts/gpu_check.sh on one NVIDIA H100 80GB HBM3 (driver 580.159.04, CUDA 13.0),
torch 2.11.0+cu130 with NCCL 2.28.9, JAX 0.11.2 (docs/guides/NCCL.md, "Verified on a GPU"):

- tf_otel_nccl_606.gz / _607.gz: the rings the real plugin wrote in the two ranks of a
  torch.distributed NCCL job (one GPU, one NCCL_HOSTID per rank: NET/Socket over lo), 400
  collectives each; nccl_w2_rank<r>.json.gz: what each rank issued, in order, and the CUPTI
  kernels torch.profiler saw meanwhile; w1_tf_otel_nccl_571.gz: the ring of a one-rank job;
- jax_gpu.xplane.pb.gz + jax_xplane.json: a JAX profiler XSpace (TF's format) of 5 x 4 jitted
  calls, and the host wall-clock window of each call;
- nvml.json.gz: tf_otel.metrics.gpu_metrics sampling NVML every 0.1 s, idle / bf16 matmul
  load / idle, with what the OTel SDK collected.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tf_otel.nccl import ring as ringmod
from tf_otel.nccl.kernels import parse_kernel_name
from tf_otel.record import KERNEL, Record

H100 = Path(__file__).parent / "fixtures" / "h100"
RINGS = {0: "tf_otel_nccl_606", 1: "tf_otel_nccl_607"}
SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int32": "i32"}
SHORT.update({"float64": "f64", "int8": "i8"})
SIZE = {"f32": 4, "bf16": 2, "f16": 2, "i32": 4, "f64": 8, "i8": 1}
KINETO_COLL = {"allreduce": "AllReduce", "_allgather_base": "AllGather"}
KINETO_COLL.update({"broadcast": "Broadcast", "_reduce_scatter_base": "ReduceScatter"})


def _ring(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_bytes(gzip.decompress((H100 / f"{name}.gz").read_bytes()))
    return str(path)


def _job(rank: int) -> dict:
    return json.loads(gzip.decompress((H100 / f"nccl_w2_rank{rank}.json.gz").read_bytes()))


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    d = tmp_path_factory.mktemp("rings")
    out = {}
    for rank, name in RINGS.items():
        reader = ringmod.RingReader.open(_ring(d, name))
        out[rank] = reader.poll(flush=True)
        assert reader.lost == 0 and reader.header()["dropped"] == 0
        reader.close()
    return out


def _kernels(rank: int) -> list:
    job = _job(rank)
    base = job["kineto"]["baseTimeNanoseconds"]  # Kineto: ts in us after this epoch ns
    out = []
    for k in job["kineto"]["kernels"]:
        start = base + round(k["ts"] * 1000)
        parsed = parse_kernel_name(k["name"])
        assert parsed is not None, k["name"]
        attrs = {**parsed.attributes(), "kineto.dtype": k["args"]["dtype"]}
        attrs["kineto.collective"] = KINETO_COLL[k["args"]["Collective name"]]
        out.append(Record(k["name"], start, start + round(k["dur"] * 1000), KERNEL, None, attrs))
    return sorted(out, key=lambda r: r.start_ns)


# ---------------------------------------------------------------- the plugin's ring
def test_one_rank_job_loads_the_plugin_but_nccl_reports_no_collective(tmp_path):
    """A one-rank communicator: NCCL initialises the plugin (v5) but copies with cudaMemcpy,
    no kernel and no Coll event (enqueue.cc: nRanks == 1 -> ncclLaunchOneRank)."""
    reader = ringmod.RingReader.open(_ring(tmp_path, "w1_tf_otel_nccl_571"))
    h = reader.header()
    assert (h["version"], h["api_version"], h["capacity"]) == (1, 5, 16384)
    assert h["write_index"] == 0 and reader.poll(flush=True) == []


@pytest.mark.parametrize("rank", [0, 1])
def test_every_issued_collective_is_one_record_in_issue_order(records, rank):
    job = _job(rank)
    recs = records[rank]
    assert len(recs) == len(job["issued"]) == 400
    by_type = defaultdict(list)
    for r in recs:
        by_type[r.attributes["nccl.collective"]].append(r)
    issued = defaultdict(list)
    for p in job["issued"]:
        issued[p["coll"]].append(p)
    assert {c: len(v) for c, v in by_type.items()} == {c: len(v) for c, v in issued.items()}
    for coll, rs in by_type.items():
        rs.sort(key=lambda r: r.attributes["nccl.seq"])
        assert [r.attributes["nccl.seq"] for r in rs] == list(range(len(rs)))  # per type
        for r, p in zip(rs, issued[coll]):
            a = r.attributes
            short = SHORT[p["dtype"]]
            if coll in ("AllGather", "Broadcast"):  # torch sends these as bytes (ncclInt8)
                assert (a["nccl.dtype"], a["nccl.count"]) == ("i8", p["count"] * SIZE[short])
            else:
                assert (a["nccl.dtype"], a["nccl.count"]) == (short, p["count"])
            assert a["nccl.bytes"] == a["nccl.count"] * SIZE[a["nccl.dtype"]]
            assert (a["nccl.rank"], a["nccl.nranks"], a["nccl.profiler_version"]) == (rank, 2, 5)
            assert a["nccl.timing"] == "execution" and a["nccl.channels"] >= 1
            assert "nccl.op" not in a  # v2+ descriptors carry no reduction op
            assert r.name == f"nccl.{coll}" and r.category == KERNEL


def test_comm_hash_collective_and_seq_join_the_ranks_and_seq_alone_does_not(records):
    keys = {
        rank: {
            (
                r.attributes["nccl.comm_hash"],
                r.attributes["nccl.collective"],
                r.attributes["nccl.seq"],
            )
            for r in recs
        }
        for rank, recs in records.items()
    }
    assert keys[0] == keys[1] and len(keys[0]) == 400
    assert len({r.attributes["nccl.comm_hash"] for r in records[0]}) == 1
    # NCCL numbers collectives per type: (comm_hash, seq) names 160, not 400, collectives
    assert len({(h, s) for h, _, s in keys[0]}) == 160


@pytest.mark.parametrize("rank", [0, 1])
def test_each_collective_is_written_at_its_coll_stop_then_at_its_last_child(tmp_path, rank):
    job = _job(rank)
    reader = ringmod.RingReader.open(_ring(tmp_path, RINGS[rank]))
    events, lost = reader.read_new()
    assert lost == 0 and len(events) >= 800
    writes = defaultdict(list)
    for e in events:
        writes[e.key].append(e)
    assert len(writes) == 400
    for ws in writes.values():
        first, last = ws[0], ws[-1]
        assert first.flags == 0 and first.nchildren == 0 and first.end_ns == first.enqueued_ns
        assert last.flags & ringmod.FLAG_CHILD_TIMING and last.nchildren >= 2
        assert first.start_ns == last.start_ns <= last.enqueued_ns < last.end_ns
        assert last.gpu_end > last.gpu_start > 0  # KernelCh GPU timers (v5)
        assert job["ops_start_ns"] <= last.start_ns and last.end_ns < job["ops_end_ns"] + 50e6
    algos = {(e.algo, e.proto) for e in events}
    assert {("RING", "LL"), ("RING", "SIMPLE"), ("PAT", "SIMPLE")} <= algos


@pytest.mark.parametrize("rank", [0, 1])
def test_gpu_duration_matches_cupti_kernel_duration(records, rank):
    """nccl.gpu_duration_ns (KernelCh GPU timers) against the CUPTI duration of the same
    kernel: CUPTI's is 2-3 us longer (launch to the first channel's timer, last to the end)."""
    kernels = _kernels(rank)
    assert ringmod.join_kernels(kernels, records[rank]) == 400
    ring = {(r.attributes["nccl.collective"], r.attributes["nccl.seq"]): r for r in records[rank]}
    for k in kernels:
        r = ring[(k.attributes["nccl.collective"], k.attributes["nccl.seq"])]
        diff = (k.end_ns - k.start_ns) - r.attributes["nccl.gpu_duration_ns"]
        assert 0 < diff < 20_000
        assert r.end_ns >= k.end_ns  # the last child stops after the kernel ends
        assert k.start_ns > r.start_ns - 100_000  # NCCL's Coll start comes just after launch


@pytest.mark.parametrize("rank", [0, 1])
def test_join_puts_what_nccl_ran_on_the_real_cupti_kernels(records, rank):
    kernels = _kernels(rank)
    names = Counter(k.attributes["nccl.op"] for k in kernels if "nccl.op" in k.attributes)
    assert names == {"Sum": 240}  # Max collectives too: the kernel's op is a specialisation
    assert {k.attributes["nccl.protocol"] for k in kernels} == {"LL"}
    assert ringmod.join_kernels(kernels, records[rank]) == 400
    seen: Counter = Counter()
    for k in kernels:
        a = k.attributes
        coll = a["nccl.collective"]
        assert coll == a["kineto.collective"]
        assert a["nccl.seq"] == seen[coll]  # the n-th kernel of a type is its n-th collective
        seen[coll] += 1
        assert "nccl.op" not in a
        if coll in ("AllReduce", "ReduceScatter"):  # the ring's dtype, not the kernel's u8/u32
            want = {"Float": "f32", "BFloat16": "bf16", "Half": "f16", "Int": "i32"}
            want.update({"Double": "f64", "Char": "i8"})
            assert a["nccl.dtype"] == want[a["kineto.dtype"]]
    assert {k.attributes["nccl.protocol"] for k in kernels} == {"LL", "SIMPLE"}


def test_a_kernel_can_start_before_its_coll_event_so_the_join_needs_slack(records):
    """Rank 1 launched onto an idle stream: its kernel began 17 us before NCCL's Coll start
    (ncclLaunchKernelAfter). Without slack the join lost that kernel and shifted the rest."""
    kernels = _kernels(1)
    ring = sorted(records[1], key=lambda r: r.start_ns)
    early = 0
    by_type = defaultdict(list)
    for r in ring:
        by_type[r.attributes["nccl.collective"]].append(r)
    seen: Counter = Counter()
    for k in kernels:
        c = k.attributes["nccl.collective"]
        early += k.start_ns < by_type[c][seen[c]].start_ns
        seen[c] += 1
    assert early >= 1
    assert ringmod.join_kernels(_kernels(1), records[1], slack_ns=0) < 400


# ---------------------------------------------------------------- a real XSpace (JAX, CUPTI)
@pytest.fixture(scope="module")
def xspace_kernels():
    from tf_otel.sources.xplane_gpu import gpu_kernel_records

    return gpu_kernel_records(gzip.decompress((H100 / "jax_gpu.xplane.pb.gz").read_bytes()))


def test_real_gpu_plane_gives_one_kernel_record_per_launch(xspace_kernels):
    calls = json.loads((H100 / "jax_xplane.json").read_text())["calls"]
    assert len(xspace_kernels) == len(calls) == 20
    names = Counter(k.name for k in xspace_kernels)
    assert set(names.values()) == {5} and len(names) == 4
    assert "triton_softmax_2" in names and "input_reduce_fusion" in names
    for k in xspace_kernels:
        a = k.attributes
        assert (a["gpu.device"], a["gpu.stream"], k.category) == (0, 14, KERNEL)
        assert "grid:" in a["gpu.kernel_details"] and isinstance(a["gpu.correlation_id"], int)
        assert "tensorflow.op.name" not in a  # tf_op is "XlaModule:" for XLA's kernels
        assert a["xla.hlo_module"] in ("jit_matmul", "jit_reduce_sum", "jit_softmax")
        assert "nccl.collective" not in a
    ops = {k.attributes.get("xla.op_name") for k in xspace_kernels}
    assert "jit(matmul)/dot_general" in ops


def test_real_gpu_plane_times_fall_inside_the_host_calls_that_ran_them(xspace_kernels):
    """The time base (Task Environment profile_start_time + line + offset) on real output:
    every kernel lies inside the wall-clock window of the jitted call that launched it."""
    info = json.loads((H100 / "jax_xplane.json").read_text())
    calls = sorted(info["calls"], key=lambda c: c["start_ns"])
    for k, call in zip(xspace_kernels, calls):
        assert call["start_ns"] <= k.start_ns < k.end_ns <= call["end_ns"]
        assert k.attributes["xla.hlo_module"] == "jit_" + call["fn"]
        assert 1_000 < k.end_ns - k.start_ns < 1_000_000


# ---------------------------------------------------------------- NVML through gpu_metrics
@pytest.fixture(scope="module")
def nvml():
    return json.loads(gzip.decompress((H100 / "nvml.json.gz").read_bytes()))


def test_real_nvml_samples_have_every_reading(nvml):
    env = json.loads((H100 / "env.json").read_text())
    total_mib = int(env["nvidia_smi"].splitlines()[1].split(",")[2].split()[0])
    assert nvml["errors"] == 0 and len(nvml["samples"]) == nvml["sample_count"] > 50
    for s in nvml["samples"]:
        v = s["values"]["0"]
        assert set(v) == {
            "hw.gpu.utilization",
            "hw.gpu.memory.usage",
            "hw.gpu.memory.limit",
            "hw.gpu.memory.utilization",
            "hw.power",
            "hw.temperature",
        }
        assert v["hw.gpu.memory.limit"] == total_mib * 2**20  # NVML = nvidia-smi's 81559 MiB
        assert 0 <= v["hw.gpu.utilization"] <= 1 and 0 < v["hw.gpu.memory.utilization"] < 1
        assert 30 < v["hw.power"] < 800 and 15 < v["hw.temperature"] < 95
    ts = [s["t_ns"] for s in nvml["samples"]]
    assert ts == sorted(ts) and 0.08e9 < (ts[-1] - ts[0]) / (len(ts) - 1) < 0.2e9


def test_step_summaries_of_the_real_samples_follow_the_load(nvml):
    """Replays the recorded samples through GpuSampler.step_summary: what the step spans of a
    busy and of an idle step would have carried."""
    from tf_otel.metrics.gpu_metrics import GpuSampler

    sampler = GpuSampler(nvml=None, handles=[], attributes={}, interval_s=0.1)
    for s in nvml["samples"]:
        sampler._ring.append((s["t_ns"], {int(d): v for d, v in s["values"].items()}))
    got = {}
    for p in nvml["phases"]:
        got[p["phase"]] = sampler.step_summary(0, p["start_ns"], p["end_ns"])
        assert got[p["phase"]] == pytest.approx(p["step_summary"])
    assert got["idle_before"]["hw.gpu.utilization"] < 0.1
    assert got["matmul_load"]["hw.gpu.utilization"] > 0.8  # NVML follows the load ~0.3 s late
    assert got["matmul_load"]["hw.gpu.memory.usage"] > got["idle_after"]["hw.gpu.memory.usage"]


def test_what_the_otel_sdk_collected_from_the_real_gpu(nvml):
    points = nvml["collections"][1]["points"]  # collected right after the load phase
    by = {p["metric"]: p for p in points}
    assert {m: (p["unit"], p["type"]) for m, p in by.items()} == {
        "hw.gpu.utilization": ("1", "Gauge"),
        "hw.gpu.memory.usage": ("By", "Sum"),
        "hw.gpu.memory.limit": ("By", "Sum"),
        "hw.gpu.memory.utilization": ("1", "Gauge"),
        "hw.power": ("W", "Gauge"),
        "hw.temperature": ("Cel", "Gauge"),
    }
    for p in points:
        assert p["attributes"]["hw.name"] == "NVIDIA H100 80GB HBM3"
        assert p["attributes"]["tf_otel.rank"] == 0 and p["scope"] == "tf_otel.nccl.gpu_metrics"
    assert by["hw.gpu.utilization"]["attributes"]["hw.gpu.task"] == "general"
    assert by["hw.temperature"]["attributes"]["hw.parent"] == "gpu0"
    assert by["hw.gpu.utilization"]["value"] > 0.8 and by["hw.power"]["value"] > 300
