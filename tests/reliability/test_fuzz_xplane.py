"""Fuzzed XSpace parsing (tf_otel.sources.xplane host plane, tf_otel.sources.xplane_gpu GPU planes):
arbitrary bytes, the real fixture (tests/nccl/fixtures/) truncated and corrupted, and
structurally valid XSpaces built from the real TSL schema with odd stats, metadata ids, names and
offsets. The contract: the result, or the one clear ``ValueError`` that names the XSpace (not a
serialized XSpace, or no time base); never another exception, in bounded time.

TensorFlow is imported once, in this process (for the schema).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # before hypothesis runs

from tf_otel.nccl import kernels
from tf_otel.nccl.kernels import parse_kernel_name
from tf_otel.sources.xplane import host_records, parse_xspace
from tf_otel.sources.xplane_gpu import gpu_kernel_records, load_xspace

FIXTURE = (
    Path(__file__).parent.parent / "nccl" / "fixtures" / "two_gpu_nccl.xplane.pb"
).read_bytes()
FUZZ = settings(
    max_examples=200,
    deadline=3000,  # ms per example: generous for a loaded 2-core machine, still "bounded"
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def records_or_clear_error(src, base_ns=None):
    """Both readers on ``src``; a ValueError must name the XSpace problem."""
    for read in (
        lambda: host_records(load_xspace(src), step=1, base_ns=base_ns),
        lambda: gpu_kernel_records(src, step=1, base_ns=base_ns, rank=0, max_events=50),
    ):
        try:
            for r in read():
                assert isinstance(r.start_ns, int) and isinstance(r.end_ns, int)
        except ValueError as error:
            assert "XSpace" in str(error), error


_int64 = st.integers(-(2**63), 2**63 - 1)
_uint64 = st.integers(0, 2**64 - 1)
_odd = st.sampled_from([0, 1, -1, 2**63 - 1, -(2**63), 10**18]) | _int64
_ids = st.integers(-3, 8) | _int64
_stat_names = st.sampled_from(
    ["profile_start_time", "tf_function_call", "correlation_id", "device_id", "context_id",
     "kernel_details", "tf_op", "annotation", "stream", ""]
) | st.text(max_size=10)  # fmt: skip
_event_names = st.sampled_from(
    ["IteratorGetNextOp::DoCompute", "dense/MatMul:MatMul", "x:IteratorGetNext", ":", "a:",
     "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclKernel_AllReduce_RING_LL_Sum_float",
     "ncclDevKernel_Generic", "MemcpyH2D", ""]
) | st.text(max_size=20)  # fmt: skip
_display_names = st.sampled_from(["MatMul", "IteratorGetNext", ""]) | st.text(max_size=8)
_plane_names = st.sampled_from(
    ["Task Environment", "/host:CPU", "/device:GPU:0", "/device:GPU:7", "/device:GPU:",
     "/device:GPU:" + "9" * 5000, "/device:GPU:-1"]
) | st.text(max_size=15)  # fmt: skip
_line_names = st.sampled_from(
    ["Stream #7(Compute)", "Stream #", "Stream #" + "1" * 5000, "TensorFlow Ops", "tf_Compute",
     "Stream #18446744073709551615"]
) | st.text(max_size=15)  # fmt: skip


@st.composite
def stats(draw, into):
    for _ in range(draw(st.integers(0, 3))):
        stat = into.add(metadata_id=draw(_ids))
        kind = draw(st.sampled_from(["none", "double", "uint64", "int64", "str", "bytes", "ref"]))
        if kind == "double":
            stat.double_value = draw(st.floats())
        elif kind == "uint64":
            stat.uint64_value = draw(_uint64)
        elif kind == "int64":
            stat.int64_value = draw(_odd)
        elif kind == "str":
            stat.str_value = draw(st.text(max_size=20))
        elif kind == "bytes":
            stat.bytes_value = draw(st.binary(max_size=20))
        elif kind == "ref":
            stat.ref_value = draw(_uint64)


@st.composite
def xspaces(draw):
    space = xplane_pb2.XSpace()
    for _ in range(draw(st.integers(0, 3))):
        plane = space.planes.add(id=draw(_odd), name=draw(_plane_names))
        for _ in range(draw(st.integers(0, 4))):
            key = draw(_ids)
            plane.stat_metadata[key].id = draw(st.sampled_from([key, 0]) | _ids)
            plane.stat_metadata[key].name = draw(_stat_names)
        for _ in range(draw(st.integers(0, 4))):
            key = draw(_ids)
            md = plane.event_metadata[key]
            md.id, md.name = key, draw(_event_names)
            md.display_name = draw(
                st.sampled_from(["MatMul", "IteratorGetNext", ""]) | st.text(max_size=8)
            )
            draw(stats(md.stats))
        draw(stats(plane.stats))
        for _ in range(draw(st.integers(0, 2))):
            line = plane.lines.add(name=draw(_line_names), timestamp_ns=draw(_odd))
            for _ in range(draw(st.integers(0, 4))):
                ev = line.events.add(metadata_id=draw(_ids), duration_ps=draw(_odd))
                if draw(st.booleans()):
                    ev.offset_ps = draw(_odd)
                else:
                    ev.num_occurrences = draw(_odd)
                draw(stats(ev.stats))
    return space


@settings(FUZZ, max_examples=100)  # each example: both readers on a message and its bytes
@given(xspaces(), st.sampled_from([None, 0, 1_700_000_000_000_000_000]))
@example(xplane_pb2.XSpace(planes=[xplane_pb2.XPlane(name="/device:GPU:" + "9" * 5000)]), 0)
@example(
    xplane_pb2.XSpace(
        planes=[
            xplane_pb2.XPlane(
                name="/device:GPU:0", lines=[xplane_pb2.XLine(name="Stream #" + "1" * 5000)]
            )
        ]
    ),
    0,
)  # both were ValueError (int() of 5000 digits) out of gpu_kernel_records
def test_valid_xspaces_with_odd_values(space, base_ns):
    records_or_clear_error(space, base_ns)  # the message, as TF would hand it over
    records_or_clear_error(space.SerializeToString(), base_ns)  # bytes (the lenient schema)


@st.composite
def damaged_fixtures(draw):
    data = FIXTURE[: draw(st.integers(0, len(FIXTURE)))]
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(data)))
        junk = draw(st.binary(min_size=1, max_size=8))
        data = data[:at] + junk + data[at + len(junk) :]
    return data


@FUZZ
@given(damaged_fixtures() | st.binary(max_size=2000), st.sampled_from([None, 5]))
def test_damaged_and_arbitrary_bytes(data, base_ns):
    try:
        parse_xspace(data)
    except ValueError as error:
        assert "not a serialized XSpace" in str(error)
    records_or_clear_error(data, base_ns)


def test_a_bad_file_names_its_path(tmp_path):
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(b"\xff\xff\xff garbage")
    with pytest.raises(ValueError, match=f"{path}: .*not a serialized XSpace"):
        load_xspace(str(path))


_kernel_words = st.sampled_from(
    ["ncclDevKernel", "ncclKernel", "void ncclDevKernel", "AllReduce", "AllGather", "Generic",
     "SendRecv", "Sum", "MinMax", "f32", "bf16", "float", "__nv_bfloat16", "RING", "NVLS_TREE",
     "TREE", "LL", "LL128", "SIMPLE", "", "(ncclDevKernelArgsStorage<4096ul>)", "<", "("]
) | st.text(max_size=6)  # fmt: skip


@FUZZ
@given(st.lists(_kernel_words, max_size=8).map("_".join) | st.text(max_size=80))
def test_kernel_names_parse_to_known_parts_or_none(name):
    k = parse_kernel_name(name)
    if k is not None:
        assert k.collective in (None, *kernels.COLLECTIVES)
        assert k.op in (None, *kernels.REDOPS)
        assert k.algorithm in (None, *kernels.ALGORITHMS)
        assert k.protocol in (None, *kernels.PROTOCOLS)
        assert all(isinstance(v, str) for v in k.attributes().values())
    for normalize in (
        kernels.normalize_dtype,
        kernels.normalize_algorithm,
        kernels.normalize_protocol,
        kernels.normalize_collective,
    ):
        assert normalize(name) is None or isinstance(normalize(name), str)
