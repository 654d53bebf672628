"""ctypes views of NCCL's profiler plugin ABI (ext-profiler/example/nccl/profiler_vN.h), to
drive the real tf_otel plugin the way NCCL calls it (plugin tests and tests/nccl/ring_job.py).
"""

from __future__ import annotations

import ctypes as C
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COLL, PROXY_OP, KERNEL_CH, GROUP = 1 << 1, 1 << 3, 1 << 6, 1 << 0


# ---- descriptor layouts (ext-profiler/example/nccl/profiler_vN.h) ----
class ProxyOp(C.Structure):
    _fields_ = [
        ("pid", C.c_int),
        ("channelId", C.c_uint8),
        ("peer", C.c_int),
        ("nSteps", C.c_int),
        ("chunkSize", C.c_int),
        ("isSend", C.c_int),
    ]


class KernelCh4(C.Structure):
    _fields_ = [("channelId", C.c_uint8), ("pTimer", C.c_uint64)]


class CollV1(C.Structure):
    _fields_ = [
        ("name", C.c_char_p),
        ("commHash", C.c_uint64),
        ("seqNumber", C.c_uint64),
        ("func", C.c_uint8),
        ("sendBuff", C.c_void_p),
        ("recvBuff", C.c_void_p),
        ("count", C.c_size_t),
        ("root", C.c_int),
        ("datatype", C.c_uint8),
        ("op", C.c_uint32),
        ("trafficBytes", C.c_size_t),
        ("nMaxChannels", C.c_uint8),
        ("nWarps", C.c_uint8),
        ("algo", C.c_uint8),
        ("proto", C.c_uint8),
        ("isCollnet", C.c_int),
        ("isNvls", C.c_int),
    ]


class CollV3(C.Structure):
    _fields_ = [
        ("name", C.c_char_p),
        ("commHash", C.c_uint64),
        ("seqNumber", C.c_uint64),
        ("func", C.c_char_p),
        ("sendBuff", C.c_void_p),
        ("recvBuff", C.c_void_p),
        ("count", C.c_size_t),
        ("root", C.c_int),
        ("datatype", C.c_char_p),
        ("nMaxChannels", C.c_uint8),
        ("nWarps", C.c_uint8),
        ("algo", C.c_char_p),
        ("proto", C.c_char_p),
    ]


class CollV4(C.Structure):
    _fields_ = [
        ("seqNumber", C.c_uint64),
        ("func", C.c_char_p),
        ("sendBuff", C.c_void_p),
        ("recvBuff", C.c_void_p),
        ("count", C.c_size_t),
        ("root", C.c_int),
        ("datatype", C.c_char_p),
        ("nChannels", C.c_uint8),
        ("nWarps", C.c_uint8),
        ("algo", C.c_char_p),
        ("proto", C.c_char_p),
    ]


class CollV5(C.Structure):
    _fields_ = CollV4._fields_ + [("parentGroup", C.c_void_p)]


class CollApiV5(C.Structure):
    _fields_ = [
        ("func", C.c_char_p),
        ("count", C.c_size_t),
        ("datatype", C.c_char_p),
        ("root", C.c_int),
        ("stream", C.c_void_p),
        ("graphCaptured", C.c_bool),
    ]


def _descr(type_c, union_fields):
    class U(C.Union):
        _fields_ = union_fields

    class D(C.Structure):
        _anonymous_ = ("u",)
        _fields_ = [("type", type_c), ("parentObj", C.c_void_p), ("rank", C.c_int), ("u", U)]

    return D


DescrV1 = _descr(C.c_uint8, [("coll", CollV1), ("proxyOp", ProxyOp)])
DescrV3 = _descr(C.c_uint8, [("coll", CollV3), ("proxyOp", ProxyOp), ("kernelCh", C.c_uint8 * 1)])
DescrV4 = _descr(C.c_uint8, [("coll", CollV4), ("proxyOp", ProxyOp), ("kernelCh", KernelCh4)])
DescrV5 = _descr(
    C.c_uint64,
    [("collApi", CollApiV5), ("coll", CollV5), ("proxyOp", ProxyOp), ("kernelCh", KernelCh4)],
)


class StateArgsV4(C.Union):
    _fields_ = [("transSize", C.c_size_t), ("pTimer", C.c_uint64)]


R = C.c_int
VP, VPP = C.c_void_p, C.POINTER(C.c_void_p)
INT_P = C.POINTER(C.c_int)


def _profiler(init_args, descr):
    class P(C.Structure):
        _fields_ = [
            ("name", C.c_char_p),
            ("init", C.CFUNCTYPE(R, *init_args)),
            ("startEvent", C.CFUNCTYPE(R, VP, VPP, C.POINTER(descr))),
            ("stopEvent", C.CFUNCTYPE(R, VP)),
            ("recordEventState", C.CFUNCTYPE(R, VP, C.c_int, C.POINTER(StateArgsV4))),
            ("finalize", C.CFUNCTYPE(R, VP)),
        ]

    return P


ProfV1 = _profiler([VPP, INT_P], DescrV1)
ProfV3 = _profiler([VPP, INT_P], DescrV3)
V4_INIT = [VPP, INT_P, C.c_char_p, C.c_uint64, C.c_int, C.c_int, C.c_int, C.c_void_p]
ProfV4 = _profiler(V4_INIT, DescrV4)
V5_INIT = [VPP, C.c_uint64, INT_P, C.c_char_p, C.c_int, C.c_int, C.c_int, C.c_void_p]
ProfV5 = _profiler(V5_INIT, DescrV5)


def build_plugin(directory: Path) -> Path:
    """The plugin compiled by the project's build script into ``directory``."""
    assert shutil.which(os.environ.get("CC", "gcc")), "a C compiler is part of the set-up"
    so = directory / "libnccl-profiler-tf_otel.so"
    out = subprocess.run(
        [str(ROOT / "scripts" / "build_nccl_plugin.sh"), str(so)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "built" in out.stdout
    return so
