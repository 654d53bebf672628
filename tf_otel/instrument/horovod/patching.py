"""What tf_otel patches in Horovod: ``hvd.init()`` (the source is chosen just before it), the
collective op functions of Horovod's TF library (timed by ``stamps``), Horovod's per-gradient
``tf.cond`` (timed around it in TF1 graphs), and
``hvd.DistributedOptimizer`` (a Keras 3 optimizer given to it is reported once: Horovod does not
average its gradients).

Usage::

    from tf_otel.instrument.horovod import patching
    patching.register()   # post-import hooks; nothing is imported here
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from tf_otel.health import fail_open, log_once
from tf_otel.instrument._patching import when_imported, wrap
from tf_otel.instrument.horovod import graph_stamps
from tf_otel.instrument.horovod.collective_source import choice
from tf_otel.instrument.horovod.stamp_graph import OPS
from tf_otel.instrument.horovod.stamps import graph

RESET_FLUSH_S = 1.0  # the most an elastic reset waits for this rank's spans to be written
_inits = 0  # hvd.init() calls that initialised Horovod in this process


def _init_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    """``hvd.init()``: the source is chosen before the first one. A later one after
    ``hvd.shutdown()`` is an elastic reset (``hvd.elastic.run``): what this rank holds is
    written first, since Horovod's own init aborts a worker the driver removed (no exit
    handler runs), and the pipeline takes the new world after it."""
    global _inits
    reset = False
    with fail_open("horovod.before_init"):
        choice.before_init()
        choice.basics = instance
        reset = _inits > 0 and not instance.is_initialized()
        if reset:
            _before_reset()
    result = wrapped(*args, **kwargs)
    with fail_open("horovod.after_init"):
        _inits += 1
        if reset:
            _after_reset(instance)
    return result


def _before_reset() -> None:
    from tf_otel.runtime.lifecycle import current_pipeline

    pipeline = current_pipeline()
    if pipeline is not None:
        pipeline.flush_now(RESET_FLUSH_S)


def _after_reset(basics: Any) -> None:
    from tf_otel.runtime.lifecycle import current_pipeline

    pipeline = current_pipeline()
    if pipeline is not None:
        pipeline.change_world(basics.rank(), basics.size())


def _patch_basics(module: Any) -> None:
    wrap(module.HorovodBasics, "init", _init_wrapper)


def _patch_mpi_lib(module: Any) -> None:
    """Replace the op functions of Horovod's TF library with timed ones. Not wrapt: AutoGraph
    warns about wrapt-decorated functions on every tf.function that calls them."""
    library = getattr(module, "MPI_LIB", None)
    tf = sys.modules.get("tensorflow")
    if library is None or tf is None:
        return
    for name, (op, grouped) in OPS.items():
        original = getattr(library, name, None)
        if original is None or getattr(original, "_tf_otel_original", None) is not None:
            continue
        setattr(library, name, timed_op(original, graph.wrapper(op, grouped), tf))


_CONDS = {"_allreduce_cond": False, "_grouped_allreduce_cond": True}  # -> grouped


def _patch_conds(module: Any) -> None:
    """Horovod's per-gradient ``tf.cond`` (DistributedOptimizer, DistributedGradientTape): in a
    TF1 graph its stamps go around it (graph_stamps). Module functions that the module itself
    calls by name, so replacing the attribute reaches its callers."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return
    for name, grouped in _CONDS.items():
        original = getattr(module, name, None)
        if original is None or getattr(original, "_tf_otel_original", None) is not None:
            continue
        setattr(module, name, timed_op(original, graph.cond_wrapper(grouped), tf))


def timed_op(original: Callable, wrapper: Callable, tf: Any) -> Callable:
    """A plain function standing in for ``original`` that calls ``wrapper(original, None,
    args, kwargs)``; AutoGraph leaves it alone (it would warn on a wrapt-wrapped one in every
    tf.function that calls it)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return wrapper(original, None, args, kwargs)

    call.__name__ = getattr(original, "__name__", "horovod_op")
    call.__doc__ = original.__doc__
    timed = tf.autograph.experimental.do_not_convert(call)
    timed._tf_otel_original = original
    return timed


def _patch_session_runs(module: Any) -> None:
    """Every run a TF1 step makes, once Horovod is imported (TensorFlow is by then): its stamps
    on detail steps, prepared ahead (graph_stamps)."""
    session = sys.modules.get("tensorflow.python.client.session")
    if session is not None:
        wrap(session.BaseSession, "_do_run", graph_stamps.around_run)


def _is_keras3_optimizer(optimizer: Any) -> bool:
    module = type(optimizer).__module__ or ""
    if not module.startswith("keras"):
        return False
    keras = sys.modules.get("keras")
    return str(getattr(keras, "__version__", "3")).startswith("3")


def _check_optimizer(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    optimizer = args[0] if args else kwargs.get("optimizer")
    with fail_open("horovod.keras3_check"):
        if _is_keras3_optimizer(optimizer):
            log_once(
                "hvd_keras3",
                "tf_otel: hvd.DistributedOptimizer got a Keras 3 optimizer (%s): Horovod does "
                "not average its gradients, so ranks silently diverge. Use tf_keras "
                "(TF_USE_LEGACY_KERAS=1, pip install tf_keras), or hvd.DistributedGradientTape "
                "in a custom loop over tf.Variable sources (a Keras 3 model's variables fail in "
                "Horovod's tape: 'Variable' object has no attribute 'ref')",
                type(optimizer).__name__,
            )
    return wrapped(*args, **kwargs)


def _patch_optimizer(module: Any) -> None:
    if hasattr(module, "DistributedOptimizer"):
        wrap(module, "DistributedOptimizer", _check_optimizer)


def register() -> None:
    """Post-import hooks (idempotent: wrap() wraps once)."""
    when_imported("horovod.common.basics", _patch_basics)
    when_imported("horovod.tensorflow.mpi_ops", _patch_mpi_lib)
    when_imported("horovod.tensorflow", _patch_conds)
    when_imported("horovod.tensorflow", _patch_session_runs)
    for module in ("horovod.tensorflow", "horovod.tensorflow.keras", "horovod.keras"):
        when_imported(module, _patch_optimizer)
