"""Threads a detail twin's trace starts, paced like the trace itself.

Usage::

    from tf_otel.instrument import twin_threads
    twin_threads.register(settings)  # once: MirroredStrategy's replica threads

MirroredStrategy traces each replica's step function on a thread of its own
(``_MirroredReplicaThread``, the replicas one after another, the calling thread waiting): in a
twin's trace most of the Python (the model's layers, the gradients) runs there, not on the
``tf_otel-twin`` thread whose pacer holds it to the CPU the training leaves idle. Unpaced, the
twin's replica threads took ~6.6 s of CPU in the first ~12 s after the twin was queued, and
the steps meanwhile ran 690-830 ms against 490-560 ms after (MobileNetV2 96², 2 replicas on 2
cores; docs/benchmarks/mirrored.md). A replica thread started by a thread that is pacing a
twin's trace gets a pacer of its own at that pacer's share (``Pacer.fork``); threads the
program's own traces start are left alone.
"""

from __future__ import annotations

import sys
from types import CodeType
from typing import Any, Callable, Optional

from tf_otel.config import Settings
from tf_otel.health import fail_open
from tf_otel.instrument import detail_twin
from tf_otel.instrument._patching import when_imported, wrap

_MIRRORED_RUN = "tensorflow.python.distribute.mirrored_run"
_ATTR = "_tf_otel_pacer"


def _start(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    """On the thread that starts the replica thread: is it pacing a twin's trace?"""
    with fail_open("twin_threads.start"):
        pacer = detail_twin.pacer_here()
        if pacer is not None:
            setattr(
                instance, _ATTR, pacer.fork(within=_code_of(getattr(instance, "main_fn", None)))
            )
    return wrapped(*args, **kwargs)


def _code_of(function: Any) -> Optional[CodeType]:
    """The replica function's code: Abandoned is raised into the replica thread only inside it,
    where the thread's coordinator (``stop_on_exception``) hands it back to the twin's thread;
    raised in the thread's own set-up it would end the thread and leave its starter waiting."""
    code = getattr(getattr(function, "__func__", function), "__code__", None)
    return code if isinstance(code, CodeType) else None


def _run(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    """On the replica thread: paced where its starter was."""
    pacer = getattr(instance, _ATTR, None)
    if pacer is None:
        return wrapped(*args, **kwargs)
    sys.setprofile(pacer)  # this thread only
    try:
        return wrapped(*args, **kwargs)
    finally:
        sys.setprofile(None)


def _patch(module: Any) -> None:
    replica_thread = getattr(module, "_MirroredReplicaThread", None)
    if replica_thread is None:
        return
    wrap(replica_thread, "start", _start)
    wrap(replica_thread, "run", _run)


def register(settings: Settings) -> None:
    """Post-import hook (idempotent)."""
    when_imported(_MIRRORED_RUN, _patch)
