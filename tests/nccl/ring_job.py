"""A traced custom-loop job whose "NCCL" is this script: the real tf_otel profiler plugin is
loaded from NCCL_PROFILER_PLUGIN and called through ncclProfiler_v4 as NCCL calls it, for the
two allreduces each step launches (from a tf.py_function inside the tf.function step). Only the
GPU and NCCL itself are missing. Run under horovodrun -np 2 (gloo): both ranks use one
communicator hash and the same sequence numbers, as NCCL's ranks of one communicator do.
"""

from __future__ import annotations

import ctypes as C
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nccl_driver import COLL, PROXY_OP, DescrV4, ProfV4  # noqa: E402

COMM_HASH = 0x5EED0123456789AB
STEPS = int(os.environ.get("STEPS", "5"))
rank = int(os.environ["HOROVOD_RANK"])
plugin = ProfV4.in_dll(C.CDLL(os.environ["NCCL_PROFILER_PLUGIN"]), "ncclProfiler_v4")
context, mask = C.c_void_p(), C.c_int()
assert plugin.init(C.byref(context), C.byref(mask), b"comm", COMM_HASH, 1, 2, rank, None) == 0
sequence = itertools.count()


def _event(descr: DescrV4) -> C.c_void_p:
    handle = C.c_void_p()
    assert plugin.startEvent(context, C.byref(handle), C.byref(descr)) == 0
    return handle


def launch_allreduces() -> int:
    """What NCCL reports for two ncclAllReduce calls: enqueue, then the proxy op finishing."""
    for _ in range(2):
        coll = DescrV4(type=COLL, rank=rank)
        coll.coll.seqNumber = next(sequence)
        coll.coll.func, coll.coll.count, coll.coll.datatype = b"AllReduce", 4096, b"ncclFloat32"
        coll.coll.nChannels, coll.coll.algo, coll.coll.proto = 2, b"Ring", b"Simple"
        handle = _event(coll)
        assert plugin.stopEvent(handle) == 0
        proxy = DescrV4(type=PROXY_OP, parentObj=handle, rank=rank)
        proxy.proxyOp.pid = os.getpid()
        assert plugin.stopEvent(_event(proxy)) == 0
    return 0


import tensorflow as tf  # noqa: E402


@tf.function
def train_step(x):
    launched = tf.py_function(launch_allreduces, [], tf.int32)
    return tf.reduce_sum(x * 2.0) + tf.cast(launched, tf.float32)


for _ in range(STEPS):
    train_step(tf.ones([64]))
assert plugin.finalize(context) == 0
print(f"rank {rank} done", flush=True)
