"""Stand-in torch.distributed: each collective calls the plugin in NCCL_PROFILER_PLUGIN as NCCL
2.28.9 did (Coll start/stop, then ProxyOp and KernelCh children); the comm hash is shared."""

import ctypes as C
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/nccl: nccl_driver
from nccl_driver import COLL, KERNEL_CH, PROXY_OP, DescrV5, ProfV5, StateArgsV4  # noqa: E402


class ReduceOp:
    SUM, MAX = "Sum", "Max"


NCCL_TYPES = {"float32": b"ncclFloat32", "bfloat16": b"ncclBfloat16", "float16": b"ncclFloat16"}
NCCL_TYPES.update({"int32": b"ncclInt32", "float64": b"ncclFloat64", "int8": b"ncclInt8"})
_s = {}


def init_process_group(backend, init_method=None, rank=0, world_size=1, **kw):
    _s.update(rank=rank, world=world_size, seq={})
    path = os.environ.get("NCCL_PROFILER_PLUGIN")
    if path:
        lib = C.CDLL(path)
        p = ProfV5.in_dll(lib, "ncclProfiler_v5")
        ctx, mask = C.c_void_p(), C.c_int()
        p.init(C.byref(ctx), 0x5EED5EED, C.byref(mask), b"w", world_size, world_size, rank, None)
        _s.update(lib=lib, p=p, ctx=ctx)


def _coll(func, t, root=0):
    if "p" not in _s or _s["world"] == 1:  # one rank: NCCL copies, no kernel, no Coll event
        return
    p, ctx = _s["p"], _s["ctx"]
    d = DescrV5(type=COLL, rank=_s["rank"])
    d.coll.seqNumber = _s["seq"].get(func, 0)
    _s["seq"][func] = d.coll.seqNumber + 1  # NCCL numbers collectives per type
    d.coll.func, d.coll.count, d.coll.datatype, d.coll.root = func, t.n, NCCL_TYPES[t.dtype], root
    d.coll.nChannels, d.coll.nWarps, d.coll.algo, d.coll.proto = 1, 3, b"RING", b"LL"
    h = C.c_void_p()
    p.startEvent(ctx, C.byref(h), C.byref(d))
    p.stopEvent(h)
    kids = []
    for kind in (PROXY_OP, PROXY_OP, KERNEL_CH):
        k = DescrV5(type=kind, rank=_s["rank"], parentObj=h)
        if kind == PROXY_OP:
            k.proxyOp.pid = os.getpid()
        else:
            k.kernelCh.pTimer = time.time_ns()
        kh = C.c_void_p()
        p.startEvent(ctx, C.byref(kh), C.byref(k))
        kids.append((kind, kh))
    for kind, kh in kids:
        if kind == KERNEL_CH:
            p.recordEventState(kh, 22, C.byref(StateArgsV4(pTimer=time.time_ns())))
        p.stopEvent(kh)


def all_reduce(t, op=None):
    _coll(b"AllReduce", t)


def all_gather_into_tensor(out, inp):
    _coll(b"AllGather", inp)


def broadcast(t, src=0):
    _coll(b"Broadcast", t, src)


def reduce_scatter_tensor(out, inp, op=None):
    _coll(b"ReduceScatter", out)


def destroy_process_group():
    if "p" in _s:
        _s["p"].finalize(_s["ctx"])
