"""TensorFlow's own collectives as collective spans: MultiWorkerMirroredStrategy's all-reduces
(one per gradient pack) and all-gathers, timed exactly as Horovod's are (instrument/horovod/
stamps.py: stamps in the detail twin only, every worker's arrival gathered on rank 0, the wait
for the last worker and the transfer), so the analysis, reports and dashboards see one kind of
collective; the spans are named ``tensorflow.allreduce <op name>``.

Where: ``tf.distribute``'s cross-device code (``cross_device_utils.CollectiveReplicaLauncher``)
builds every all-reduce, packed or not, and every all-gather by calling
``all_reduce_v2`` / ``all_gather_v2`` of ``tensorflow.python.ops.collective_ops`` through the
module; those functions (and ``all_to_all_v2``, the V1 ``all_reduce`` / ``all_gather``) are
replaced by timed stand-ins once TensorFlow is imported. Building a
``CollectiveAllReduceExtended`` (what MultiWorkerMirroredStrategy is made of) tells the stamps
source that this process's collectives are TensorFlow's (``choice.tf_collectives``), so the
twin is traced beside the step function, as with Horovod. Broadcasts (``broadcast_send_v2`` /
``_recv_v2``: variable initialisation, before training) are not timed.

Usage::

    from tf_otel.instrument import tf_collectives
    tf_collectives.register(settings)   # post-import hooks; nothing is imported here
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from tf_otel import record
from tf_otel.config import Settings
from tf_otel.health import fail_open
from tf_otel.instrument._patching import (
    Error,
    HookOrder,
    StepCall,
    StepHook,
    add_step_hook,
    when_imported,
    wrap,
)
from tf_otel.instrument.horovod.collective_source import choice
from tf_otel.instrument.horovod.patching import timed_op
from tf_otel.instrument.horovod.stamp_graph import TENSORFLOW
from tf_otel.instrument.horovod.stamps import graph
from tf_otel.step_handle import StepHandle

# collective_ops function -> op (each takes its input tensor first)
OPS = {
    "all_reduce_v2": "allreduce",
    "all_gather_v2": "allgather",
    "all_to_all_v2": "alltoall",
    "all_reduce": "allreduce",
    "all_gather": "allgather",
}
_MODULE = "tensorflow.python.ops.collective_ops"
_STRATEGY = "tensorflow.python.distribute.collective_all_reduce_strategy"
_MIRRORED = "tensorflow.python.distribute.mirrored_strategy"


def _patch_ops(tf: Any) -> None:
    """Once ``tensorflow`` is whole (the stand-ins need tf.autograph)."""
    module = sys.modules.get(_MODULE)
    if module is None:
        return
    for name, op in OPS.items():
        original = getattr(module, name, None)
        if original is None or getattr(original, "_tf_otel_original", None) is not None:
            continue
        setattr(module, name, timed_op(original, graph.wrapper(op, False, TENSORFLOW), tf))


def _strategy_built(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    out = wrapped(*args, **kwargs)
    choice.tf_collectives = True
    return out


def _mirrored_built(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    """MirroredStrategy over several devices reduces with collective ops by default (RING on
    CPUs, NCCL on GPUs); other cross-device ops (NcclAllReduce, HierarchicalCopyAllReduce,
    ReductionToOneDevice given by the program) build no collective op and are not timed."""
    out = wrapped(*args, **kwargs)
    with fail_open("tf_collectives.mirrored"):
        from tensorflow.python.distribute import cross_device_ops

        ops = getattr(instance, "_cross_device_ops", None)
        devices = getattr(instance, "_devices", ())
        replicas_hook.devices = max(replicas_hook.devices, len(devices))
        if isinstance(ops, cross_device_ops.CollectiveAllReduce) and len(devices) > 1:
            choice.tf_collectives = True
            choice.replicas = max(choice.replicas, len(devices))
    return out


class _ReplicasHook(StepHook[None]):
    """Puts the MirroredStrategy's device count on sampled step spans: a one-process job of
    several replicas communicates, and a step without collective spans did not measure it."""

    order = HookOrder.HOROVOD

    def __init__(self) -> None:
        self.devices = 0

    def on_step_end(self, handle: StepHandle, call: StepCall, error: Error, kept: None) -> None:
        if self.devices > 1 and handle.sampled:
            handle.attributes[record.ATTR_STEP_REPLICAS] = self.devices


replicas_hook = _ReplicasHook()


def _patch_strategy(module: Any) -> None:
    wrap(module.CollectiveAllReduceExtended, "__init__", _strategy_built)


def _patch_mirrored(module: Any) -> None:
    wrap(module.MirroredExtended, "__init__", _mirrored_built)


def register(settings: Settings) -> None:
    """Post-import hooks (idempotent). TF_OTEL_HOROVOD=0 turns these spans off too."""
    choice.use(settings)
    when_imported("tensorflow", _patch_ops)
    when_imported(_STRATEGY, _patch_strategy)
    when_imported(_MIRRORED, _patch_mirrored)
    add_step_hook(replicas_hook)
