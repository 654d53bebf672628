"""Detail-step twins of the program's tf.functions: timing ops live only in a second trace of the
program's own function, run on the steps that are detailed; every other step runs exactly the
program's graph.

Usage::

    from tf_otel.instrument import twin
    twin.wanted_by(lambda: True)       # a source wants timing ops (e.g. the Horovod stamps)
    twin.want(True)                    # step hook, on a detail step's start
    result = twin.call(function, wrapped, args, kwargs)   # where the step calls its function
    if twin.tracing(): ...             # graph construction: inside a twin's trace?
    twin.want(False)                   # the step's end

A twin is ``Function._clone``: the same Python function and options, its own traces. While a
twin traces, ``tracing()`` is true on that thread, so sources add their timing ops to the twin's
graph only; tf.functions called inside it are swapped for their own twins, so a nested function
the program shares between steps is never traced with timing ops into the program's graph.

The twin is traced on the step that traced the program's function (``get_concrete_function``
with the same arguments: a step that was slow anyway), not on the first detail step. Its first
run is slow too (TF instantiates and optimises a concrete function on its first call: 7.6 s
against 0.29 s steps, MobileNetV3Small, 2 ranks on 2 loaded cores), and there is no way to do
that without running it: so the step after a new twin trace is a detail step as well
(``warm_pending``; its source asks), and that cost falls in the warm-up, next to the trace,
instead of on a steady step (where it looked like a straggler and cost a short job up to 10 %).
Cost: a second set of traced graphs in memory; nothing on steps without detail.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List

from tf_otel.health import count, fail_open, report_failure

_OWN_MODULE = "tf_otel"


class _TwinState(threading.local):
    wanted = False  # this thread's running step is a detail step
    tracing = 0  # > 0 inside a twin's call (its trace, and tf.functions traced within it)


_state = _TwinState()

_sources: List[Callable[[], bool]] = []  # does a source want timing ops now?
# a twin was traced and has not run yet: its first run (instantiation) is due
_warm = {"pending": False}


def wanted_by(source: Callable[[], bool]) -> None:
    """A source of timing ops (once per process): twins are traced while it says so."""
    if source not in _sources:
        _sources.append(source)


def enabled() -> bool:
    return any(source() for source in _sources)


def warm_pending() -> bool:
    """A twin was traced beside the program's function and has not run: the next step should
    be a detail step, so that the twin's first (slow) run falls next to the trace."""
    return _warm["pending"]


def want(on: bool) -> None:
    """A detail step starts (True) or ends (False) on this thread."""
    _state.wanted = on


def tracing() -> bool:
    """Graph construction on this thread belongs to a twin: timing ops go in."""
    return _state.tracing > 0


_BROKEN = False  # a function whose twin failed to trace: it runs as the program's own


def _twin_of(function: Any) -> Any:
    """The function's twin (made once), or None where it cannot be made or traced."""
    twin = getattr(function, "_tf_otel_twin", None)
    if twin is None:
        twin = _BROKEN
        with fail_open("twin.make"):
            twin = function._clone(None)
            twin._tf_otel_twin_of = function
            count("twin_functions")
        function._tf_otel_twin = twin
    return None if twin is _BROKEN else twin


def _traced(function: Any, twin: Any, args: tuple, kwargs: dict) -> bool:
    """Trace (or find) the twin's graph for these arguments before it runs: a twin that cannot
    be traced (e.g. it would create variables) is given up, once, and the program's own
    function runs; errors while running a traced twin are the program's own and propagate."""
    _state.tracing += 1
    try:
        twin.get_concrete_function(*args, **kwargs)
        return True
    except Exception as exc:  # noqa: BLE001
        function._tf_otel_twin = _BROKEN
        report_failure("twin.trace", exc)
        return False
    finally:
        _state.tracing -= 1


def _is_own(function: Any) -> bool:
    python_function = getattr(function, "_python_function", None)
    return (getattr(python_function, "__module__", "") or "").startswith(_OWN_MODULE)


def _run_twin(function: Any, twin: Any, args: tuple, kwargs: dict) -> Any:
    _warm["pending"] = False
    _state.tracing += 1
    try:
        return twin(*args, **kwargs)
    finally:
        _state.tracing -= 1


def call(function: Any, wrapped: Callable, args: tuple, kwargs: dict, top: bool) -> Any:
    """Call a tf.function the program called: its twin on a detail step's top-level call and
    inside a twin's trace, else the program's own (tracing the twin beside a new trace of it).
    ``top``: the step's own call of its function (not a call nested in another function)."""
    if _is_own(function) or getattr(function, "_tf_otel_twin_of", None) is not None:
        return wrapped(*args, **kwargs)
    if _state.tracing or (top and _state.wanted):
        twin = _twin_of(function)
        if twin is not None and (_state.tracing or _traced(function, twin, args, kwargs)):
            return _run_twin(function, twin, args, kwargs)
        return wrapped(*args, **kwargs)
    counter = getattr(function, "experimental_get_tracing_count", None)
    if not top or counter is None or not enabled():
        return wrapped(*args, **kwargs)
    before = counter()
    result = wrapped(*args, **kwargs)
    if counter() != before:
        _trace_twin(function, args, kwargs)
    return result


def _trace_twin(function: Any, args: tuple, kwargs: dict) -> None:
    """The program's function was traced on this call: trace its twin for the same arguments
    now, so the first detail step runs a ready graph."""
    twin = _twin_of(function)
    if twin is None:
        return
    before = twin.experimental_get_tracing_count()
    if _traced(function, twin, args, kwargs):
        count("twin_traces")
        if twin.experimental_get_tracing_count() != before:  # a new graph, never run
            _warm["pending"] = True
