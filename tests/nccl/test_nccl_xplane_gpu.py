"""GPU planes of a TF profiler XSpace -> kernel Records, and their placement under collectives.

The XSpace is built with the venv TF's real xplane_pb2, laid out as TF's CUPTI collector writes
GPU planes (plane "/device:GPU:<n>", stream lines "Stream #<id>(...)", kernel names in
event_metadata, stats named through stat_metadata). No GPU made it: see docs/guides/NCCL.md.
Regenerate the saved fixture with: .venv/bin/python tests/nccl/test_nccl_xplane_gpu.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tf_otel.nccl import ring as ringmod
from tf_otel.record import COLLECTIVE, KERNEL, Record
from tf_otel.sources.xplane_gpu import gpu_kernel_records, load_xspace, place_under_collectives

FIXTURE = Path(__file__).parent / "fixtures" / "two_gpu_nccl.xplane.pb"
T0 = 1_700_000_000_000_000_000  # profile_start_time (epoch ns)
NCCL_AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
EIGEN = "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<float>, long>(float, long)"


def build_xspace():
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace(hostnames=["worker-0"])

    env = space.planes.add(id=0, name="Task Environment")
    env.stat_metadata[1].id, env.stat_metadata[1].name = 1, "profile_start_time"
    env.stat_metadata[2].id, env.stat_metadata[2].name = 2, "profile_stop_time"
    env.stats.add(metadata_id=1, uint64_value=T0)
    env.stats.add(metadata_id=2, uint64_value=T0 + 10_000_000)

    host = space.planes.add(id=1, name="/host:CPU")
    host.event_metadata[1].id, host.event_metadata[1].name = 1, "HorovodAllreduce:Op"
    hl = host.lines.add(id=100, name="tf_Compute", timestamp_ns=0)
    hl.events.add(metadata_id=1, offset_ps=0, duration_ps=10**9)

    def gpu_plane(pid, n):
        p = space.planes.add(id=pid, name=f"/device:GPU:{n}")
        for i, name in enumerate(
            ["correlation_id", "device_id", "context_id", "kernel_details", "tf_op", "annotation"],
            start=1,
        ):
            p.stat_metadata[i].id, p.stat_metadata[i].name = i, name
        return p

    def kernel(line, md_id, off_ns, dur_ns, corr, device, tf_op=None, annotation=None):
        e = line.events.add(metadata_id=md_id, offset_ps=off_ns * 1000, duration_ps=dur_ns * 1000)
        e.stats.add(metadata_id=1, uint64_value=corr)
        e.stats.add(metadata_id=2, uint64_value=device)
        e.stats.add(metadata_id=3, uint64_value=1)
        if md_id != 3:  # memcpy activities carry memcpy_details, not kernel_details
            e.stats.add(metadata_id=4, str_value="regs:64 grid:2,1,1 block:512,1,1")
        if tf_op:
            e.stats.add(metadata_id=5, str_value=tf_op)
        if annotation:
            e.stats.add(metadata_id=6, str_value=annotation)

    g0 = gpu_plane(2, 0)
    for i, name in ((1, NCCL_AR), (2, EIGEN), (3, "MemcpyH2D"), (4, "ncclDevKernel_Generic")):
        g0.event_metadata[i].id, g0.event_metadata[i].name = i, name
    compute = g0.lines.add(id=7, name="Stream #7(Compute,MemcpyH2D)", timestamp_ns=5_000)
    kernel(compute, 2, 1_000, 4_000, corr=11, device=0, tf_op="dense/MatMul:MatMul")
    kernel(compute, 3, 6_000, 500, corr=12, device=0)
    nccl = g0.lines.add(id=14, name="Stream #14(Compute)", timestamp_ns=5_000)
    kernel(nccl, 1, 20_000, 30_000, corr=13, device=0, annotation="HorovodAllreduce_grad_0")
    kernel(nccl, 4, 60_000, 2_000, corr=14, device=0)
    derived = g0.lines.add(id=0xDEADBEEF, name="TensorFlow Ops", timestamp_ns=5_000)
    derived.events.add(metadata_id=2, offset_ps=1_000_000, duration_ps=4_000_000)

    g1 = gpu_plane(3, 1)
    g1.event_metadata[1].id = 1
    g1.event_metadata[1].name = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
    s1 = g1.lines.add(id=21, name="Stream #21(Compute)", timestamp_ns=7_000)
    kernel(s1, 1, 0, 25_000, corr=5, device=1)
    return space


def test_saved_fixture_is_what_the_builder_makes():
    assert FIXTURE.exists(), "run this file with python to (re)generate the fixture"
    assert str(load_xspace(str(FIXTURE))) == str(build_xspace())  # lenient schema copy: by content


def test_fixture_kernels_times_and_attributes():
    recs = gpu_kernel_records(str(FIXTURE), step=4, rank=2)
    assert [r.name.split("(")[0] for r in recs] == [
        "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<float>, long>",
        "ncclKernel_AllReduce_RING_LL_Sum_float",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        "ncclDevKernel_Generic",
    ]  # the memcpy and the derived "TensorFlow Ops" line are not kernels
    eigen, old, ar, generic = recs
    assert all(r.category == KERNEL and r.step == 4 for r in recs)
    assert all(r.attributes["tf_otel.rank"] == 2 for r in recs)
    assert (ar.start_ns, ar.end_ns) == (T0 + 5_000 + 20_000, T0 + 5_000 + 50_000)
    assert (old.start_ns, old.end_ns) == (T0 + 7_000, T0 + 32_000)
    a = ar.attributes
    assert (a["nccl.collective"], a["nccl.op"], a["nccl.dtype"]) == ("AllReduce", "Sum", "f32")
    assert (a["nccl.algorithm"], a["nccl.protocol"]) == ("RING", "LL")
    assert (a["gpu.device"], a["gpu.stream"], a["gpu.correlation_id"]) == (0, 14, 13)
    assert a["gpu.annotation"] == "HorovodAllreduce_grad_0"
    assert (old.attributes["gpu.device"], old.attributes["gpu.stream"]) == (1, 21)
    assert old.attributes["nccl.dtype"] == "f32" and old.attributes["nccl.op"] == "Sum"
    assert generic.attributes["nccl.collective"] == "Generic"
    assert "nccl.algorithm" not in generic.attributes
    assert not any(k.startswith("nccl.") for k in eigen.attributes)
    assert eigen.attributes["tensorflow.op.name"] == "dense/MatMul:MatMul"


def test_time_base_needs_task_environment_or_base_ns():
    space = build_xspace()
    del space.planes[0]  # TF 2.15 has no "Task Environment" plane
    with pytest.raises(ValueError, match="base_ns"):
        gpu_kernel_records(space)
    recs = gpu_kernel_records(space, base_ns=1_000_000_000)
    assert min(r.start_ns for r in recs) == 1_000_000_000 + 5_000 + 1_000


def test_not_an_xspace_is_one_clear_error():
    with pytest.raises(ValueError, match="not a serialized XSpace"):
        gpu_kernel_records(b"\xff\xff\xff garbage")


def test_max_events_bounds_the_output():
    assert len(gpu_kernel_records(build_xspace(), max_events=2)) == 2


def _coll(name, start, end, step=4, **attrs):
    return Record(name=name, start_ns=start, end_ns=end, category=COLLECTIVE, step=step,
                  attributes=attrs)  # fmt: skip


def test_nccl_kernels_go_under_the_collective_that_launched_them():
    recs = gpu_kernel_records(build_xspace())
    eigen, old, ar, generic = recs
    base = T0 + 5_000
    # two collectives overlap the AllReduce kernel; the annotation names the second
    other = _coll("allreduce.other", base + 10_000, base + 55_000, **{"horovod.tensor": "x"})
    named = _coll("allreduce.grad", base + 15_000, base + 40_000,
                  **{"horovod.tensor": "HorovodAllreduce_grad_0"})  # fmt: skip
    step = Record(name="step", start_ns=base, end_ns=base + 10**6, category="step")
    placed = place_under_collectives(recs, [step, other, named])
    assert ar.parent_id == named.record_id
    assert generic.parent_id is None  # starts after every collective ended
    assert eigen.parent_id is None  # not NCCL: stays under the step
    assert old.parent_id == other.record_id  # GPU:1 kernel at base+2000..+27000 overlaps
    assert placed == 2


def test_largest_overlap_wins_and_slack_extends_the_collective():
    recs = gpu_kernel_records(build_xspace())
    ar = recs[2]
    base = T0 + 5_000
    short = _coll("c1", base + 19_000, base + 22_000)
    long = _coll("c2", base + 21_000, base + 49_000)
    place_under_collectives([ar], [short, long])
    assert ar.parent_id == long.record_id
    ar.parent_id = None
    early = _coll("c3", base + 10_000, base + 19_000)  # ends before the kernel starts
    assert place_under_collectives([ar], [early]) == 0 and ar.parent_id is None
    assert place_under_collectives([ar], [early], slack_ns=5_000) == 1
    assert ar.parent_id == early.record_id and ar.step == 4


def test_ring_keys_join_onto_cupti_kernels():
    kernels = gpu_kernel_records(build_xspace())
    base = T0 + 5_000

    def ev(seq, start):
        return ringmod.CollEvent(
            index=seq, comm_hash=0xAB, seq=seq, start_ns=start, enqueued_ns=start + 10,
            end_ns=start + 100, count=1, bytes=4, gpu_start=0, gpu_end=0, rank=0, nranks=2,
            root=0, nchildren=0, nchannels=1, nwarps=1, api_version=4, flags=0,
            func="AllReduce", dtype="ncclFloat32", algo="Ring", proto="LL", op="",
        )  # fmt: skip

    ring_recs = [ringmod.to_record(ev(1, base - 7_000)), ringmod.to_record(ev(2, base + 15_000))]
    n = ringmod.join_kernels(kernels, ring_recs)
    old, ar = kernels[1], kernels[2]
    # kernels in start order: old (GPU:1, base+2000) takes seq 1, ar (base+20000) takes seq 2
    assert n == 2
    assert (old.attributes["nccl.seq"], ar.attributes["nccl.seq"]) == (1, 2)
    assert ar.attributes["nccl.comm_hash"] == "00000000000000ab"
    assert "nccl.seq" not in kernels[3].attributes  # Generic: no ring event of that type


def test_real_cpu_profile_has_task_environment_time_base_and_no_gpu_kernels(tmp_path):
    """A real TF profiler capture on this CPU machine: the time base parses, no GPU planes."""
    import glob
    import time

    import tensorflow as tf

    before = time.time_ns()
    tf.profiler.experimental.start(str(tmp_path))
    tf.reduce_sum(tf.random.normal([64, 64]) @ tf.random.normal([64, 64])).numpy()
    tf.profiler.experimental.stop()
    (path,) = glob.glob(str(tmp_path / "plugins/profile/*/*.xplane.pb"))
    space = load_xspace(path)
    from tf_otel.sources.xplane_gpu import profile_start_ns

    start = profile_start_ns(space)
    assert start is not None and before <= start <= time.time_ns()
    assert gpu_kernel_records(space) == []


if __name__ == "__main__":
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_bytes(build_xspace().SerializeToString(deterministic=True))
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")
