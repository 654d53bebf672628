"""TF1 graph mode: every top-level ``Session.run`` is a step (``session_run``), including
MonitoredSession.run (its hooks' runs belong to that step), ``make_callable`` and the
``_make_callable_from_options`` path of the tf_keras v1 backend.

Steps are numbered per fetch signature (the names of what is fetched), so the training run
``sess.run([loss, train_op])`` counts 0, 1, 2 ... apart from initialisation or evaluation runs,
identically on every rank. Only names are recorded, never fed or fetched values.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List

from tf_otel import record
from tf_otel.instrument._patching import run_step, when_imported, wrap

ATTR_FETCHES = "tensorflow.session.fetches"
_MAX_KEY = 120


def _names(fetches: Any, out: List[str], depth: int = 0) -> None:
    if len(out) >= 16 or depth > 3:
        return
    name = getattr(fetches, "name", None)
    if isinstance(name, str):
        out.append(name.split(":")[0])
    elif isinstance(fetches, str):
        out.append(fetches.split(":")[0])
    elif isinstance(fetches, dict):
        for key in sorted(fetches, key=str):
            _names(fetches[key], out, depth + 1)
    elif isinstance(fetches, (list, tuple)):
        for item in fetches:
            _names(item, out, depth + 1)


def fetch_signature(fetches: Any) -> str:
    names: List[str] = []
    _names(fetches, names)
    return ",".join(names)[:_MAX_KEY] or "?"


def _session_step(
    wrapped: Callable, args: tuple, kwargs: dict, name: str, fetches: Any, session: Any
) -> Any:
    signature = fetch_signature(fetches)
    return run_step(
        wrapped,
        args,
        kwargs,
        f"{record.SESSION_RUN}:{signature}",
        name,
        record.SESSION_RUN,
        {ATTR_FETCHES: signature},
        instance=session,
    )


def _run_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    fetches = args[0] if args else kwargs.get("fetches")
    return _session_step(wrapped, args, kwargs, "Session.run", fetches, instance)


def _make_callable_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    fn = wrapped(*args, **kwargs)
    fetches = args[0] if args else kwargs.get("fetches", kwargs.get("callable_options"))
    if not isinstance(fetches, (str, list, tuple, dict)) and not hasattr(fetches, "name"):
        fetches = list(getattr(fetches, "fetch", []) or []) + list(getattr(fetches, "target", []))

    @functools.wraps(fn)
    def step(*call_args: Any, **call_kwargs: Any) -> Any:
        return _session_step(fn, call_args, call_kwargs, "Session.callable", fetches, instance)

    return step


def _patch_session(module: Any) -> None:
    wrap(module.BaseSession, "run", _run_wrapper)
    wrap(module.BaseSession, "make_callable", _make_callable_wrapper)
    wrap(module.BaseSession, "_make_callable_from_options", _make_callable_wrapper)


def _patch_monitored(module: Any) -> None:
    wrap(module._MonitoredSession, "run", _run_wrapper)


def register() -> None:
    when_imported("tensorflow.python.client.session", _patch_session)
    when_imported("tensorflow.python.training.monitored_session", _patch_monitored)
