"""The rest of the step's story, on the step span: time between steps and what ran there,
and the process's I/O and memory per step.

Between steps (``tf_otel.between_steps_ns``): this thread's time from the previous step's end
to this step's begin (both already timed; free). What ran there, where it can be known: Keras
callbacks' batch hooks (each callback instance's hooks are timed; the class-level methods Keras 3
inspects for ``async_safe`` are untouched, so async dispatch stays as the program set it) and
checkpoint writes (``tf.train.Checkpoint.write/save``, Keras ``Model.save/save_weights``):
``tf_otel.between_steps.callback_ns``, ``tf_otel.between_steps.checkpoint_ns`` and
``tf_otel.between_steps.top`` ("name=ms" of the slowest, at most 3).

I/O and memory (read once per step END, on the training thread; deltas since the previous step
end, so per-step figures add up to the process's totals):

- ``tf_otel.io.read_bytes`` / ``tf_otel.io.write_bytes``: ``rchar`` / ``wchar`` of
  /proc/self/io, the bytes passed to read/write syscalls by every thread of the process (tf.data
  readers run on their own threads). Not ``read_bytes``: that counts only what reached the block
  device, and a file in the page cache reads 0 there.
- ``tf_otel.io.read_ops`` / ``tf_otel.io.write_ops``: ``syscr`` / ``syscw``.
- ``tf_otel.process.cpu_time_ns``: the process's CPU time (user + system, every thread) since
  the previous step end (``time.process_time_ns``); ``tf_otel.process.cpus``: the cores it may
  run on (affinity mask). CPU time / (cpus x time between step ends) near 1: every core busy.
- ``process.memory.usage`` (semconv name): resident bytes at step end, from /proc/self/statm.
  Peak RSS per step would need VmHWM reset through /proc/self/clear_refs, which also resets the
  program's own ``ru_maxrss``: not done.

Linux only (no /proc: these attributes are absent). Cost: docs/guides/WHOLE_STEP.md.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, List, Optional, Tuple

from tf_otel import clock, record
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
from tf_otel.step_handle import StepHandle

ATTR_BETWEEN = record.ATTR_BETWEEN
ATTR_CALLBACK = record.ATTR_CALLBACK
ATTR_CHECKPOINT = record.ATTR_CHECKPOINT
ATTR_TOP = record.ATTR_TOP
ATTR_READ_BYTES = record.ATTR_READ_BYTES
ATTR_WRITE_BYTES = "tf_otel.io.write_bytes"
ATTR_READ_OPS = record.ATTR_READ_OPS
ATTR_WRITE_OPS = "tf_otel.io.write_ops"
ATTR_MEMORY = record.ATTR_MEMORY
ATTR_CPU_TIME = record.ATTR_CPU_TIME
ATTR_CPUS = record.ATTR_CPUS
_MAX_PENDING = 256
_TOP_MIN_NS = 1_000_000  # names only for what took at least 1 ms
_BATCH_HOOKS = (
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_test_batch_begin",
    "on_test_batch_end",
    "on_predict_batch_begin",
    "on_predict_batch_end",
)


class _Local(threading.local):
    def __init__(self) -> None:
        self.last_end = 0  # the previous step's end on this thread
        # (kind, name, ns) timed since the previous step's end
        self.pending: List[Tuple[str, str, int]] = []


local = _Local()
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _Proc:
    """Open /proc files read with one pread each (a few microseconds)."""

    def __init__(self) -> None:
        self.io: Optional[int] = None
        self.statm: Optional[int] = None
        self.last_io: Optional[Tuple[int, int, int, int]] = None
        self.last_cpu = time.process_time_ns()
        # the cores this process may run on (its affinity mask), what "all cores busy" means
        self.cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        self.cpus = self.cpus or os.cpu_count() or 0
        with fail_open("step_resources.proc"):
            self.io = os.open("/proc/self/io", os.O_RDONLY)
        with fail_open("step_resources.proc"):
            self.statm = os.open("/proc/self/statm", os.O_RDONLY)

    def read_io(self) -> Optional[Tuple[int, int, int, int]]:
        if self.io is None:
            return None
        fields = os.pread(self.io, 512, 0).split()
        # rchar, wchar, syscr, syscw: the first four "name: value" pairs
        return int(fields[1]), int(fields[3]), int(fields[5]), int(fields[7])

    def rss(self) -> Optional[int]:
        if self.statm is None:
            return None
        return int(os.pread(self.statm, 128, 0).split()[1]) * _PAGE


_proc: List[_Proc] = []  # opened at the first step (the fds would otherwise leak into forks)


def note(kind: str, name: str, ns: int) -> None:
    """Something timed on the training thread between steps (a callback, a checkpoint)."""
    if len(local.pending) < _MAX_PENDING:
        local.pending.append((kind, name, ns))


def timed(kind: str, name: str, fn: Callable) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
        start = clock.now_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            note(kind, name, clock.now_ns() - start)

    call._tf_otel_timed = True  # type: ignore[attr-defined]
    return call


class ResourceHook(StepHook[None]):
    order = HookOrder.RESOURCES

    def on_step_start(self, handle: StepHandle, call: StepCall) -> None:
        if not _proc:  # opened at the first step; I/O is counted from its begin
            _proc.append(_Proc())
            _proc[0].last_io = _proc[0].read_io()
        pending, local.pending = local.pending, []
        last_end, local.last_end = local.last_end, 0
        if not handle.sampled or not last_end:
            return
        attributes = handle.attributes
        attributes[ATTR_BETWEEN] = max(0, handle.start_ns - last_end)
        totals = {"callback": 0, "checkpoint": 0}
        by_name: dict = {}
        for kind, name, ns in pending:
            totals[kind] = totals.get(kind, 0) + ns
            by_name[name] = by_name.get(name, 0) + ns
        attributes[ATTR_CALLBACK] = totals["callback"]
        attributes[ATTR_CHECKPOINT] = totals["checkpoint"]
        top = sorted((ns, name) for name, ns in by_name.items() if ns >= _TOP_MIN_NS)[-3:]
        if top:
            attributes[ATTR_TOP] = [f"{name}={ns / 1e6:.1f}ms" for ns, name in reversed(top)]

    def on_step_end(self, handle: StepHandle, call: StepCall, error: Error, kept: None) -> None:
        local.last_end = clock.now_ns()
        local.pending = []  # callbacks run INSIDE a step (custom code) are the step's own time
        if not _proc:
            return
        proc = _proc[0]
        now = proc.read_io()
        last, proc.last_io = proc.last_io, now
        cpu = time.process_time_ns()
        last_cpu, proc.last_cpu = proc.last_cpu, cpu
        if not handle.sampled:
            return
        handle.attributes[ATTR_CPU_TIME] = cpu - last_cpu
        handle.attributes[ATTR_CPUS] = proc.cpus
        if now is not None and last is not None:
            attributes = handle.attributes
            attributes[ATTR_READ_BYTES] = now[0] - last[0]
            attributes[ATTR_WRITE_BYTES] = now[1] - last[1]
            attributes[ATTR_READ_OPS] = now[2] - last[2]
            attributes[ATTR_WRITE_OPS] = now[3] - last[3]
        rss = proc.rss()
        if rss is not None:
            handle.attributes[ATTR_MEMORY] = rss


hook = ResourceHook()


def _time_callbacks(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    with fail_open("step_resources.callbacks"):
        for callback in getattr(instance, "callbacks", ()):
            name = type(callback).__name__
            for hook_name in _BATCH_HOOKS:
                # only the callback's own overrides; the instance attribute shadows the class's
                method = getattr(callback, hook_name, None)
                if method is None or getattr(method, "_tf_otel_timed", False):
                    continue
                if getattr(type(callback), hook_name, None) is getattr(
                    _base_callback(callback), hook_name, None
                ):
                    continue
                setattr(callback, hook_name, timed("callback", name, method))
    return result


def _base_callback(callback: Any) -> Any:
    for klass in type(callback).__mro__:
        if klass.__name__ == "Callback":
            return klass
    return object


def _checkpoint_wrapper(label: str) -> Callable:
    def wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        start = clock.now_ns()
        try:
            return wrapped(*args, **kwargs)
        finally:
            note("checkpoint", label, clock.now_ns() - start)

    return wrapper


def _patch_checkpoint(module: Any) -> None:
    for method in ("write", "save"):
        wrap(module.Checkpoint, method, _checkpoint_wrapper(f"Checkpoint.{method}"))


def _patch_model(cls: Any) -> None:
    for method in ("save", "save_weights"):
        wrap(cls, method, _checkpoint_wrapper(f"Model.{method}"))


def register(settings: Settings) -> None:
    add_step_hook(hook)
    when_imported(
        "keras.src.callbacks.callback_list",
        lambda module: wrap(module.CallbackList, "__init__", _time_callbacks),
    )
    when_imported(
        "tf_keras.src.callbacks",
        lambda module: wrap(module.CallbackList, "__init__", _time_callbacks),
    )
    when_imported("tensorflow.python.checkpoint.checkpoint", _patch_checkpoint)
    when_imported("keras.src.models.model", lambda module: _patch_model(module.Model))
    when_imported("tf_keras.src.engine.training", lambda module: _patch_model(module.Model))
