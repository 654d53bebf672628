"""What a detail twin asks of TensorFlow's own machinery, outside its public API: which traced
graph a call would hit (without tracing), an instantiation that runs nothing, the calling
thread's device scope. Each falls back where TensorFlow's internals moved (detail_twin.py then
behaves as before these existed: traces or instantiates on the step).

Usage::

    from tf_otel.instrument import twin_tf
    found = twin_tf.cached(twin, args, kwargs)  # its concrete function, None, or twin_tf.UNKNOWN
    scope = twin_tf.device_scope()               # "" or e.g. "/job:localhost/.../device:CPU:0"
    with twin_tf.device(scope):
        ...
    twin_tf.instantiate(concrete, args, kwargs, scope)  # raises Refused if TensorFlow ran it
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

from tf_otel.health import count, report_failure

UNKNOWN = object()  # TensorFlow's function cache could not be asked


def cached(twin: Any, args: tuple, kwargs: dict) -> Any:
    """The twin's concrete function for these arguments if it has one, None where it has none
    (calling it would trace it on this step), ``UNKNOWN`` where TensorFlow's cache cannot be
    asked (then it is traced on the step, as before). The lookup TensorFlow makes before it
    traces (tracing_compilation._maybe_define_function), without tracing: ~0.3 ms, on detail
    steps only."""
    try:
        from tensorflow.python.eager.polymorphic_function import (
            function_context,
            function_type_utils,
        )

        bound = function_type_utils.canonicalize_function_inputs(
            args, kwargs, twin._function_type, twin._default_values, twin._is_pure
        )
        if twin._created_variables:
            options = twin._no_variable_creation_config
        else:
            options = twin._variable_creation_config
        if options is None:
            return None  # never traced
        bound = function_type_utils.canonicalize_function_inputs(
            bound.args,
            bound.kwargs,
            options.polymorphic_type,
            options.default_values,
            options.is_pure,
        )
        positional = bound.args
        if options.input_signature is not None:
            signature = tuple(options.input_signature)
            positional = (*signature, *positional[len(signature) :])
        context = function_context.make_function_context(options.scope_type)
        captures = options.function_captures.capture_types if options.function_captures else {}
        lookup, _ = function_type_utils.make_canonicalized_monomorphic_type(
            positional, bound.kwargs, captures, options.polymorphic_type
        )
        return options.function_cache.lookup(lookup, context)
    except Exception as exc:  # noqa: BLE001 - TensorFlow's internals moved: as before
        report_failure("twin.lookup", exc)
        return UNKNOWN


def device(name: str) -> Any:
    """``tf.device(name)``; nothing for no scope."""
    if not name:
        return contextlib.nullcontext()
    from tensorflow.python.framework import ops

    return ops.device(name)


def device_scope() -> str:
    """The calling thread's device scope (``with tf.device("CPU")``, as Horovod's benchmark
    runs its steps): the call op is placed by it, so the twin is instantiated under it too."""
    try:
        from tensorflow.python.eager import context

        return context.context().device_name or ""
    except Exception:  # noqa: BLE001
        return ""


class Refused(Exception):
    """TensorFlow ran a function it was asked to instantiate only (never expected)."""


def instantiate(concrete: Any, args: tuple, kwargs: dict, scope: str = "") -> None:
    """Instantiate ``concrete`` for these inputs (the kernel a later call finds in TensorFlow's
    cache) without running it: the call is made with an already-cancelled cancellation manager,
    which TensorFlow checks after instantiating the function and before starting it. The
    manager is passed to this one call: ``cancellation.context()`` is process-wide, so it is
    never set (the training thread's own calls would see it)."""
    from tensorflow.python.eager import cancellation, context, execute
    from tensorflow.python.eager.polymorphic_function import function_type_utils
    from tensorflow.python.framework import errors

    bound = function_type_utils.canonicalize_function_inputs(args, kwargs, concrete.function_type)
    flat = list(concrete.function_type.unpack_inputs(bound)) + list(concrete.captured_inputs)
    atomic = concrete.inference_fn  # what a call outside any gradient tape runs
    manager = cancellation.CancellationManager()
    manager.start_cancel()
    ctx = context.context()
    attrs = tuple(itertools.chain(*ctx.function_call_options.as_attrs().items()))
    try:
        with device(scope):
            execute.execute_with_cancellation(
                atomic.name.decode("utf-8"),
                num_outputs=len(atomic.function_type.flat_outputs),
                inputs=flat,
                attrs=attrs,
                ctx=ctx,
                cancellation_manager=manager,
            )
    except errors.CancelledError:
        return  # instantiated, not started
    count("twin_instantiate_ran")
    raise Refused("a cancelled function call ran; twins are no longer instantiated ahead")
