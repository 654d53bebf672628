"""Keras 3 (``tf.keras`` in TF >= 2.16) and tf_keras (``TF_USE_LEGACY_KERAS=1``): one step per
call of the compiled train / test / predict function; with ``steps_per_execution=k`` a call runs
k batches (``tf_otel.step.batches``). Calls of tf.functions inside fit are not separate steps.

``tf_otel.batch.size``: the batch size of the running fit / evaluate / predict where Keras or the
dataset states it: the ``batch_size`` argument, Keras's default of 32 for arrays, or the
``batch()`` of a tf.data pipeline (found once per call, walking the datasets' inputs); absent
for generators, unbatched or dynamically batched input.

A ``fit`` resumed by ``BackupAndRestore`` (a fresh process after a kill or an interruption)
numbers its steps on from where the restored state says: at its first train step, the
optimizer's ``iterations`` (batches trained, restored with the weights) over
``steps_per_execution`` is the step number, and the job span and that first step carry
``tf_otel.resumed.epoch`` (the epoch it resumed in) and ``tf_otel.resumed.step``. Read once per
such ``fit``, and only where this process has counted no train step yet (a ``fit`` resumed in
the same process numbers on from the process's own count, which never repeats a number).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Optional

from tf_otel import record
from tf_otel.config import Settings
from tf_otel.health import fail_open
from tf_otel.instrument._patching import in_keras_loop, run_step, when_imported, wrap

ATTR_BATCH_SIZE = record.ATTR_BATCH_SIZE
_KERAS_DEFAULT_BATCH = 32  # fit / evaluate / predict on arrays without batch_size
_BATCH_ARGUMENT = {"fit": 2, "evaluate": 2, "predict": 1}  # batch_size's position


class _Loop(threading.local):
    batch_size: Optional[int] = None  # of the innermost running fit / evaluate / predict
    restore: Any = None  # a running fit's BackupAndRestore callback, until its first step


_loop = _Loop()

_FUNCTIONS = (
    ("make_train_function", "train_function", record.KERAS_TRAIN),
    ("make_test_function", "test_function", record.KERAS_EVALUATE),
    ("make_predict_function", "predict_function", record.KERAS_PREDICT),
)


def _steps_per_execution(model: Any) -> int:
    value = getattr(model, "steps_per_execution", 1)
    try:
        return int(getattr(value, "numpy", lambda: value)())
    except (TypeError, ValueError):
        return 1


def _timed(model: Any, fn: Callable, attribute: str, kind: str) -> Callable:
    name = f"keras.{attribute}"
    key = f"{kind}"

    # make_*_function runs again when steps_per_execution changes, so this can be fixed here
    attributes = {
        record.ATTR_STEP_BATCHES: _steps_per_execution(model),
        record.ATTR_FUNCTION_NAME: attribute,
    }

    @functools.wraps(fn)
    def step(*args: Any, **kwargs: Any) -> Any:
        size = _loop.batch_size
        own = attributes if size is None else {**attributes, ATTR_BATCH_SIZE: size}
        if _loop.restore is not None and kind == record.KERAS_TRAIN:
            _loop.restore = None
            with fail_open("keras.resume"):
                resumed = _resume(model, key, _steps_per_execution(model))
                if resumed:
                    own = {**own, **resumed}
        return run_step(fn, args, kwargs, key, name, kind, own, instance=model)

    step._tf_otel_step = True  # type: ignore[attr-defined]
    return step


def _make_function_wrapper(attribute: str, kind: str) -> Callable:
    def wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        result = wrapped(*args, **kwargs)
        fn = getattr(instance, attribute, None)
        if fn is None or getattr(fn, "_tf_otel_step", False):
            return result
        timed = _timed(instance, fn, attribute, kind)
        setattr(instance, attribute, timed)
        return timed if result is fn else result

    return wrapper


def _dataset_batch_size(dataset: Any) -> Optional[int]:
    for _ in range(64):  # map / prefetch / repeat ... down to the batch()
        size = getattr(dataset, "_batch_size", None)
        if size is not None:
            return int(size)  # a constant eager tensor
        dataset = getattr(dataset, "_input_dataset", None)
        if dataset is None:
            return None
    return None


def batch_size_of(method: str, args: tuple, kwargs: dict) -> Optional[int]:
    """The batch size a fit / evaluate / predict call states, or None."""
    position = _BATCH_ARGUMENT[method]
    size = kwargs.get("batch_size", args[position] if len(args) > position else None)
    x = kwargs.get("x", args[0] if args else None)
    if size is None and x is not None:
        if hasattr(x, "_input_dataset") or hasattr(x, "_batch_size"):
            return _dataset_batch_size(x)
        if hasattr(x, "shape") or isinstance(x, (list, tuple, dict)):
            return _KERAS_DEFAULT_BATCH  # arrays: Keras batches them itself
        return None
    return int(size) if isinstance(size, int) and size > 0 else None


_CALLBACKS_ARGUMENT = 5  # fit(x, y, batch_size, epochs, verbose, callbacks, ...)


def restore_callback(args: tuple, kwargs: dict) -> Any:
    """The ``BackupAndRestore`` callback among a fit call's callbacks (Keras 3's or tf_keras'),
    or None."""
    callbacks = kwargs.get(
        "callbacks", args[_CALLBACKS_ARGUMENT] if len(args) > _CALLBACKS_ARGUMENT else None
    )
    for callback in callbacks or ():
        if any(cls.__name__ == "BackupAndRestore" for cls in type(callback).__mro__):
            return callback
    return None


def _resume(model: Any, key: str, batches: int) -> Optional[dict]:
    """At the first train step of a fit with a ``BackupAndRestore`` (its ``on_train_begin``
    has restored): where it resumed, as the step's attributes, the step numbering continued
    from there. None where nothing was restored or this process has counted train steps."""
    optimizer = getattr(model, "optimizer", None)
    iterations = getattr(optimizer, "iterations", None)
    if iterations is None:
        return None
    done = int(iterations.numpy())  # one read of a variable, once per resumed fit
    epoch = getattr(model, "_initial_epoch", None)  # Keras 3: the restored epoch
    if epoch is None:
        epoch = _tf_keras_epoch(model)
    if done <= 0 and not epoch:
        return None
    from tf_otel.runtime.lifecycle import get_pipeline

    step = done // max(1, batches)
    resumed = {record.ATTR_RESUMED_STEP: step}
    if isinstance(epoch, int):
        resumed[record.ATTR_RESUMED_EPOCH] = epoch
    return resumed if get_pipeline().resume_at(key, step, resumed) else None


def _tf_keras_epoch(model: Any) -> Optional[int]:
    """tf_keras' BackupAndRestore: the epoch running at the fit's first train step (its
    ``WorkerTrainingState`` holds it from the epoch's begin on: the restored one where it
    resumed); None without one."""
    state = getattr(model, "_training_state", None)
    saved_epoch = getattr(state, "_ckpt_saved_epoch", None)
    if saved_epoch is None:
        return None
    epoch = int(saved_epoch.numpy())
    return epoch if epoch >= 0 else None


def _loop_wrapper(method: str) -> Callable:
    def wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        outer, outer_restore = _loop.batch_size, _loop.restore
        size = None
        with fail_open("keras.batch_size"):
            size = batch_size_of(method, args, kwargs)
            if method == "fit":
                _loop.restore = restore_callback(args, kwargs)
        _loop.batch_size = size
        try:
            return in_keras_loop(wrapped, instance, args, kwargs)
        finally:
            _loop.batch_size, _loop.restore = outer, outer_restore

    return wrapper


def _patch_trainer(cls: Any) -> None:
    for maker, attribute, kind in _FUNCTIONS:
        wrap(cls, maker, _make_function_wrapper(attribute, kind))
    for loop in ("fit", "evaluate", "predict"):
        wrap(cls, loop, _loop_wrapper(loop))


def register(settings: Settings) -> None:
    when_imported(
        "keras.src.backend.tensorflow.trainer",
        lambda module: _patch_trainer(module.TensorFlowTrainer),
    )
    when_imported("tf_keras.src.engine.training", lambda module: _patch_trainer(module.Model))
