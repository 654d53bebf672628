"""Custom training loops: each top-level call of a user ``tf.function`` from eager Python is a step
(``tf_function``), numbered per function. Functions defined inside TensorFlow, Keras, Horovod or
tf_otel are not steps; ``TF_OTEL_STEP_FUNCTIONS=a,b`` limits steps to the named functions.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple, cast

from tf_otel import record
from tf_otel.config import Settings
from tf_otel.instrument import detail_twin
from tf_otel.instrument._patching import run_step, state, when_imported, wrap

_LIBRARY_MODULES = ("tensorflow", "keras", "tf_keras", "horovod", "tf_otel")
_step_functions: Optional[Tuple[str, ...]] = None
_executing_eagerly: Optional[Callable[[], bool]] = None


def _function_name(function: Any) -> Tuple[str, str]:
    python_function = getattr(function, "_python_function", None)
    module = getattr(python_function, "__module__", "") or ""
    name = getattr(function, "_name", None) or getattr(python_function, "__name__", "function")
    return cast(str, name), module


def _is_step(function: Any) -> bool:
    cached = getattr(function, "_tf_otel_is_step", None)
    if cached is not None:
        return cached
    name, module = _function_name(function)
    if _step_functions:
        result = name in _step_functions
    else:
        result = module.split(".")[0] not in _LIBRARY_MODULES
    try:
        function._tf_otel_is_step = result
    except AttributeError:
        pass
    return result


def _call_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    # _executing_eagerly: set by register() before this wrapper is installed
    eager = _executing_eagerly()  # type: ignore[misc]
    if state.depth or state.keras_loop or not eager or not _is_step(instance):
        # nested tf.functions (and library ones) still mark the thread, so their inner calls
        # are not mistaken for steps; a step's own function (Keras's train function) or one
        # inside a twin's trace may run as its detail twin (instrument/detail_twin.py)
        top = state.depth == 1 and eager
        state.depth += 1
        try:
            return detail_twin.call(instance, wrapped, args, kwargs, top)
        finally:
            state.depth -= 1
    name, _ = _function_name(instance)
    key = f"{record.TF_FUNCTION}:{name}"
    attributes = {record.ATTR_FUNCTION_NAME: name}

    def step_call(*step_args: Any, **step_kwargs: Any) -> Any:
        return detail_twin.call(instance, wrapped, step_args, step_kwargs, True)

    title = f"tf.function {name}"
    return run_step(step_call, args, kwargs, key, title, record.TF_FUNCTION, attributes, instance)


def _patch(module: Any) -> None:
    global _executing_eagerly, _step_functions
    from tensorflow.python.eager import context

    _executing_eagerly = context.executing_eagerly
    wrap(module.Function, "__call__", _call_wrapper)


def register(settings: Settings) -> None:
    global _step_functions
    _step_functions = settings.step_functions
    when_imported("tensorflow.python.eager.polymorphic_function.polymorphic_function", _patch)
