"""Input wait of custom loops: eager ``next()`` on a tf.data iterator (``OwnedIterator``) becomes an
``input`` Record of the step it precedes (or runs inside).

    for x, y in dataset:          # each next() here ...
        train_step(x, y)          # ... is an ``input`` span of this step

A ``next()`` between two steps belongs to the next step, whose span then starts at the first
such wait (the step is "get the batch, then compute"). At most ``_MAX_PENDING`` waits are kept
per step; unsampled steps drop them (their sum still goes to the step's
``tf_otel.step.input_wait.duration``, metrics/step_metrics.py). Only timing: no element
values, shapes or sizes are read.
Keras fit gets its batches inside the train function: those waits appear in op traces
(``IteratorGetNext``), see instrument/ops/hook.py.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional

from tf_otel import clock
from tf_otel.config import Settings
from tf_otel.instrument import input_wait
from tf_otel.instrument._patching import HookOrder, StepCall, StepHook, add_step_hook, when_imported
from tf_otel.instrument._patching import state as _thread
from tf_otel.instrument._patching import wrap as _wrap
from tf_otel.record import INPUT, Record
from tf_otel.step_handle import StepHandle

_MAX_PENDING = 16
NAME = "IteratorGetNext (tf.data)"


class _Local(threading.local):
    def __init__(self) -> None:
        self.handle: Optional[StepHandle] = None  # the step running on this thread
        self.pending: List[tuple] = []  # (start_ns, end_ns) of waits since the last step


local = _Local()
_eager: List[Callable[[], bool]] = []


def _next_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    input_wait.seen.set()
    if not _eager or not _eager[0]():
        return wrapped(*args, **kwargs)
    start = clock.now_ns()
    try:
        return wrapped(*args, **kwargs)
    finally:
        end = clock.now_ns()
        handle = local.handle
        if _thread.depth and handle is not None:
            # every step: the input wait histogram (step_metrics)
            handle.input_wait_ns = (handle.input_wait_ns or 0) + end - start
            if handle.sampled and len(handle.records) < 10_000:
                handle.records.append(Record(NAME, start, end, INPUT, handle.step))
        elif len(local.pending) < _MAX_PENDING:
            local.pending.append((start, end))


class InputHook(StepHook[None]):
    order = HookOrder.INPUT

    def on_step_start(self, handle: StepHandle, call: StepCall) -> None:
        local.handle = handle
        pending, local.pending = local.pending, []
        if not pending:
            return
        # sampled or not, so that the step duration histogram measures what the span shows
        handle.start_ns = min(handle.start_ns, pending[0][0])
        handle.input_wait_ns = sum(end - start for start, end in pending)
        if not handle.sampled:
            return
        for start, end in pending:
            handle.records.append(Record(NAME, start, end, INPUT, handle.step))

    def on_step_end(
        self, handle: StepHandle, call: StepCall, error: Optional[BaseException], kept: None
    ) -> None:
        local.handle = None
        local.pending = []


def _patch(module: Any) -> None:
    from tensorflow.python.eager import context

    _eager[:] = [context.executing_eagerly]
    _wrap(module.OwnedIterator, "__next__", _next_wrapper)


hook = InputHook()


def register(settings: Settings) -> None:
    add_step_hook(hook)
    when_imported("tensorflow.python.data.ops.iterator_ops", _patch)
