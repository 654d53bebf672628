"""Keras 3 (``tf.keras`` in TF >= 2.16) and tf_keras (``TF_USE_LEGACY_KERAS=1``): one step per
call of the compiled train / test / predict function; with ``steps_per_execution=k`` a call runs
k batches (``tf_otel.step.batches``). Calls of tf.functions inside fit are not separate steps.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from tf_otel.instrument._patching import in_keras_loop, run_step, when_imported, wrap
from tf_otel.pipeline import record

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
        return run_step(fn, args, kwargs, key, name, kind, attributes, instance=model)

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


def _patch_trainer(cls: Any) -> None:
    for maker, attribute, kind in _FUNCTIONS:
        wrap(cls, maker, _make_function_wrapper(attribute, kind))
    for loop in ("fit", "evaluate", "predict"):
        wrap(cls, loop, in_keras_loop)


def register() -> None:
    when_imported(
        "keras.src.backend.tensorflow.trainer",
        lambda module: _patch_trainer(module.TensorFlowTrainer),
    )
    when_imported("tf_keras.src.engine.training", lambda module: _patch_trainer(module.Model))
