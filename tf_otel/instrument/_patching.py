"""wrapt plumbing shared by the instrument modules: post-import hooks, wrap/unwrap bookkeeping,
and the step wrapper that times one training step on the calling thread.
"""

from __future__ import annotations

import threading
from enum import IntEnum
from typing import Any, Callable, ClassVar, List, Optional, Protocol, Tuple, TypeVar

import wrapt
from opentelemetry.instrumentation.utils import unwrap

from tf_otel import clock
from tf_otel.health import fail_open, log_once, report_failure
from tf_otel.runtime.lifecycle import get_pipeline as _get_pipeline
from tf_otel.step_handle import StepHandle

_active = False
_wrapped: List[Tuple[Any, str]] = []
_lock = threading.Lock()


class _ThreadState(threading.local):
    depth = 0  # > 0 while a step runs on this thread
    keras_loop = 0  # > 0 inside Keras fit / evaluate / predict: tf.functions there are not steps


state = _ThreadState()


def activate() -> None:
    global _active
    _active = True


def deactivate() -> None:
    global _active
    _active = False
    with _lock:
        while _wrapped:
            owner, attribute = _wrapped.pop()
            with fail_open("unwrap"):
                unwrap(owner, attribute)


def deactivate_steps() -> None:
    """Stop tracing steps but keep the wrappers in place (benchmarks: on / off in one process)."""
    global _active
    _active = False


def is_active() -> bool:
    return _active


def when_imported(module_name: str, patch: Callable[[Any], object]) -> None:
    """Run ``patch(module)`` once the module is imported (now, if it already is)."""

    def hook(module: Any) -> None:
        if not _active:
            return
        with fail_open(f"patch {module_name}"):
            patch(module)

    wrapt.register_post_import_hook(hook, module_name)


def wrap(owner: Any, attribute: str, wrapper: Callable) -> None:
    """wrapt-wrap ``owner.attribute`` once, remembering it for uninstrument()."""
    current = getattr(owner, attribute, None)
    if current is None:
        log_once(
            f"missing:{owner}.{attribute}", "tf_otel: %s.%s not found; not traced", owner, attribute
        )
        return
    if isinstance(current, wrapt.ObjectProxy) and getattr(current, "_self_tf_otel", False):
        return
    wrapt.wrap_function_wrapper(owner, attribute, wrapper)
    getattr(owner, attribute)._self_tf_otel = True
    with _lock:
        _wrapped.append((owner, attribute))


class StepCall:
    """The call a step wraps; hooks may change args / kwargs (e.g. Session.run options)."""

    __slots__ = ("instance", "args", "kwargs", "kind", "result")

    def __init__(self, instance: Any, args: tuple, kwargs: dict, kind: str) -> None:
        self.instance = instance
        self.args = args
        self.kwargs = kwargs
        self.kind = kind
        self.result: Any = None


class HookOrder(IntEnum):
    """Where a step hook runs among a step's hooks, at the step's start and at its end alike
    (ties: registration order)."""

    OPS = 10  # op tracing: sets Session.run's RunOptions / starts the profiler session
    INPUT = 20  # eager next() waits: a wait just before the step moves the step's start
    INPUT_WAIT = 30  # the tf.data timing tail's totals, read at the step's end
    RESOURCES = 40  # CPU / I/O / time between steps
    DETAIL = 50  # memory and files of detail steps
    HOROVOD = 60  # collective detail: stamps (a TF1 run fetches them) or the timeline window
    NCCL = 70  # NCCL profiler ring
    OTHER = 80  # a hook that names no place (a test's, a user's)
    CONTEXT = 100  # the step becomes the thread's current context: after every capture hook


S = TypeVar("S")
Error = Optional[BaseException]  # what the step raised, None: it returned


class StepHook(Protocol[S]):
    """Extension point for per-step capture (op tracing, Horovod collectives, a user's own; public
    as ``tf_otel.hooks.StepHook``). Both methods run on the training thread for every step: keep
    them cheap, and defer conversion work with ``handle.deferred.append(fn)`` (fn() -> list of
    Records, run on the export thread).

    What a hook keeps for itself between a step's start and end (``S``): whatever
    ``on_step_start`` returns comes back to ``on_step_end`` as ``kept`` (None: nothing). What
    hooks share with each other or the pipeline is a named field of ``StepHandle`` (e.g.
    ``input_wait_ns``).

    A protocol: subclass it to inherit ``order`` and the do-nothing methods, or write a class
    with all three that the type checker matches by shape.
    """

    order: ClassVar[int] = HookOrder.OTHER

    def on_step_start(self, handle: StepHandle, call: StepCall) -> Optional[S]:
        return None

    def on_step_end(
        self, handle: StepHandle, call: StepCall, error: Error, kept: Optional[S]
    ) -> None:
        return None  # not `pass`: a protocol's empty body would make it abstract to mypy


# a tuple, replaced whole: a step's start and end run the same hooks even if one registers
# meanwhile (Horovod's at hvd.init)
step_hooks: Tuple[StepHook[Any], ...] = ()


def add_step_hook(hook: StepHook[Any]) -> None:
    """Run ``hook`` on every step, in ``hook.order`` among the others."""
    global step_hooks
    with _lock:
        if hook not in step_hooks:
            step_hooks = tuple(sorted(step_hooks + (hook,), key=lambda h: h.order))


def remove_step_hook(hook: StepHook[Any]) -> None:
    global step_hooks
    with _lock:
        step_hooks = tuple(h for h in step_hooks if h is not hook)


def run_step(
    wrapped: Callable,
    args: tuple,
    kwargs: dict,
    key: str,
    name: str,
    kind: str,
    attributes: Optional[dict] = None,
    instance: Any = None,
) -> Any:
    """Call ``wrapped`` as one training step of this rank (nested calls are not steps)."""
    if state.depth or not _active:
        return wrapped(*args, **kwargs)
    try:
        handle: Optional[StepHandle] = _get_pipeline().begin_step(
            key, name, kind, **(attributes or {})
        )
    except Exception as exc:  # noqa: BLE001
        handle = None
        report_failure("step.begin", exc)
    call = StepCall(instance, args, kwargs, kind)
    hooks = step_hooks
    kept_by_hook: List[Any] = []
    if handle is not None:
        for hook in hooks:
            try:
                kept_by_hook.append(hook.on_step_start(handle, call))
            except Exception as exc:  # noqa: BLE001
                kept_by_hook.append(None)
                report_failure(f"{type(hook).__name__}.on_step_start", exc)
    state.depth += 1
    error: Optional[BaseException] = None
    try:
        call.result = wrapped(*call.args, **call.kwargs)
    except BaseException as exc:
        error = exc
        raise
    finally:
        state.depth -= 1
        if handle is not None:
            # the step ends here: its hooks (the input share) and its span read this end, not
            # the time the hooks before them took
            handle.end_ns = clock.now_ns()
            for hook, kept in zip(hooks, kept_by_hook):
                try:
                    hook.on_step_end(handle, call, error, kept)
                except Exception as exc:  # noqa: BLE001
                    report_failure(f"{type(hook).__name__}.on_step_end", exc)
            try:
                _get_pipeline().end_step(handle, error)
            except Exception as exc:  # noqa: BLE001
                report_failure("step.end", exc)
    return call.result


def in_keras_loop(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    """wrapt wrapper for Keras fit / evaluate / predict (their steps are train-function calls)."""
    state.keras_loop += 1
    try:
        return wrapped(*args, **kwargs)
    finally:
        state.keras_loop -= 1
