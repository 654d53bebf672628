"""NCCL kernel names (as NCCL's src/device/generate.py and older NCCL builds spell them)."""

from __future__ import annotations

import pytest

from tf_otel.nccl.kernels import (
    NcclKernel,
    is_nccl_kernel,
    normalize_algorithm,
    normalize_collective,
    normalize_dtype,
    normalize_protocol,
    parse_kernel_name,
)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", ("AllReduce", "Sum", "f32", "RING", "LL")),
        ("ncclDevKernel_AllReduce_Sum_bf16_TREE_LL", ("AllReduce", "Sum", "bf16", "TREE", "LL")),
        ("ncclDevKernel_ReduceScatter_Sum_u32_RING_LL128",
         ("ReduceScatter", "Sum", "u32", "RING", "LL128")),
        ("ncclDevKernel_AllReduce_MinMax_f16_NVLS_TREE_SIMPLE",
         ("AllReduce", "MinMax", "f16", "NVLS_TREE", "SIMPLE")),
        ("ncclDevKernel_Reduce_PreMulSum_f8e4m3_RING_LL",
         ("Reduce", "PreMulSum", "f8e4m3", "RING", "LL")),
        ("ncclDevKernel_AllGather_RING_LL", ("AllGather", None, None, "RING", "LL")),
        ("ncclDevKernel_AllGatherV_RING_LL", ("AllGatherV", None, None, "RING", "LL")),
        ("ncclDevKernel_ReduceScatter_Sum_f32_COLLNET_DIRECT_SIMPLE",
         ("ReduceScatter", "Sum", "f32", "COLLNET_DIRECT", "SIMPLE")),
        ("ncclDevKernel_Broadcast_RING_LL", ("Broadcast", None, None, "RING", "LL")),
        ("ncclDevKernel_SendRecv", ("SendRecv", None, None, None, None)),
        ("ncclDevKernel_Generic", ("Generic", None, None, None, None)),
        ("ncclDevKernel_Generic_4", ("Generic", None, None, None, None)),
        ("ncclKernel_AllReduce_RING_LL_Sum_float", ("AllReduce", "Sum", "f32", "RING", "LL")),
        ("ncclKernel_AllReduce_TREE_LL128_Prod_half",
         ("AllReduce", "Prod", "f16", "TREE", "LL128")),
        ("ncclKernel_Reduce_RING_SIMPLE_Max___nv_bfloat16",
         ("Reduce", "Max", "bf16", "RING", "SIMPLE")),
        ("ncclKernel_AllGather_RING_LL_Sum_int8_t", ("AllGather", None, None, "RING", "LL")),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", ("SendRecv", None, None, "RING", "SIMPLE")),
        # what CUPTI / the demangler hands over
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
         ("AllReduce", "Sum", "f32", "RING", "LL")),
        ("void ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
         ("AllReduce", "Sum", "f32", "RING", "LL")),
    ],
)  # fmt: skip
def test_known_names(name, expected):
    k = parse_kernel_name(name)
    assert (k.collective, k.op, k.dtype, k.algorithm, k.protocol) == expected
    assert is_nccl_kernel(name)


@pytest.mark.parametrize(
    "name",
    ["", "volta_sgemm_128x64_nn", "void Eigen::internal::EigenMetaKernel<float>(float)",
     "MemcpyH2D", "nccl", "ncclAllReduce"],
)  # fmt: skip
def test_non_nccl_names_are_none(name):
    assert parse_kernel_name(name) is None
    assert not is_nccl_kernel(name)


@pytest.mark.parametrize(
    "name",
    ["ncclDevKernel_", "ncclDevKernel_Bogus_Sum_f32_RING_LL", "ncclKernel_AllReduce",
     "ncclDevKernel_AllReduce_Sum_f33_WARP_XX",
     "ncclDevKernel_AllReduce_Sum", "ncclDevKernel_(" + "x" * 5000],
)  # fmt: skip
def test_malformed_nccl_names_give_none_fields_never_raise(name):
    k = parse_kernel_name(name)
    assert isinstance(k, NcclKernel)
    assert k.collective in (None, "AllReduce")
    assert k.dtype is None and k.algorithm is None and k.protocol is None


def test_partial_fields_on_unknown_parts():
    k = parse_kernel_name("ncclDevKernel_AllReduce_Sum_f33_RING_LL")
    assert (k.collective, k.op, k.dtype) == ("AllReduce", "Sum", None)
    k = parse_kernel_name("ncclKernel_AllReduce_RING_LL_Sum_quad")
    assert (k.algorithm, k.protocol, k.op, k.dtype) == ("RING", "LL", "Sum", None)


def test_attributes_hold_only_known_fields():
    assert parse_kernel_name("ncclDevKernel_AllGather_RING_LL").attributes() == {
        "nccl.collective": "AllGather",
        "nccl.algorithm": "RING",
        "nccl.protocol": "LL",
    }


def test_normalizers_map_plugin_spellings_onto_kernel_spellings():
    assert normalize_dtype("ncclFloat32") == normalize_dtype("float") == "f32"
    assert normalize_dtype("ncclBfloat16") == "bf16" and normalize_dtype("ncclInt8") == "i8"
    assert normalize_dtype("mystery") == "mystery" and normalize_dtype(None) is None
    assert normalize_algorithm("Ring") == "RING" and normalize_algorithm("NVLSTree") == "NVLS_TREE"
    assert normalize_algorithm("CollNetDirect") == "COLLNET_DIRECT"
    assert normalize_protocol("Simple") == "SIMPLE" and normalize_protocol("LL128") == "LL128"
    assert normalize_collective("ncclAllReduce") == "AllReduce"
    assert normalize_collective("reduce_scatter") == "ReduceScatter"
    assert normalize_collective("Send") == "Send"
