"""TF1 graph mode: every top-level ``Session.run`` is a step (``session_run``), including
MonitoredSession.run (its hooks' runs belong to that step), ``make_callable`` and the
``_make_callable_from_options`` path of the tf_keras v1 backend.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from tf_otel import record
from tf_otel.instrument._patching import run_step, when_imported, wrap

KEY = record.SESSION_RUN


def _run_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    return run_step(wrapped, args, kwargs, KEY, "Session.run", record.SESSION_RUN)


def _callable_step(fn: Callable, name: str) -> Callable:
    @functools.wraps(fn)
    def step(*args: Any, **kwargs: Any) -> Any:
        return run_step(fn, args, kwargs, KEY, name, record.SESSION_RUN)

    return step


def _make_callable_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    return _callable_step(wrapped(*args, **kwargs), "Session.callable")


def _patch_session(module: Any) -> None:
    wrap(module.BaseSession, "run", _run_wrapper)
    wrap(module.BaseSession, "make_callable", _make_callable_wrapper)
    wrap(module.BaseSession, "_make_callable_from_options", _make_callable_wrapper)


def _patch_monitored(module: Any) -> None:
    wrap(module._MonitoredSession, "run", _run_wrapper)


def register() -> None:
    when_imported("tensorflow.python.client.session", _patch_session)
    when_imported("tensorflow.python.training.monitored_session", _patch_monitored)
