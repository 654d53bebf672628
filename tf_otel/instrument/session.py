"""TF1 graph mode: every top-level ``Session.run`` that trains is a step (``session_run``),
including MonitoredSession.run (its hooks' runs belong to that step), ``make_callable`` and the
``_make_callable_from_options`` path of the tf_keras v1 backend.

Steps are numbered per fetch signature (the names of what is fetched), so the training run
``sess.run([loss, train_op])`` counts 0, 1, 2 ... apart from evaluation runs, identically on
every rank. Only names are recorded, never fed or fetched values.

Runs that are NOT steps (no span, no step number):

- runs nested in a step (hooks' merged fetches, their ``after_run`` reads);
- every run made while a MonitoredSession creates or re-creates its session (SessionManager's
  init / ready / local-init runs, checkpoint restore, the Scaffold's ``init_fn``, hooks'
  ``after_create_session``) or closes it (hooks' ``end``, e.g. the final checkpoint), and runs
  made inside ``SessionManager.prepare_session`` / ``recover_session`` / ``wait_for_session``;
- initialisation runs: a run whose every fetch is a variable or table initializer (the ops of
  ``global_variables_initializer()``, ``local_variables_initializer()``,
  ``variables_initializer()``, ``tables_initializer()``, any ``tf.group`` of them) or an
  initialisation check (``is_variable_initialized``: the tf_keras v1 backend's checks). The rule
  reads the graph's variable / table-initializer collections, not op types (a training update
  may well be an ``Assign``), and is decided once per fetch signature and session.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, FrozenSet, List, Optional

from tf_otel import record
from tf_otel.config import Settings
from tf_otel.health import report_failure
from tf_otel.instrument._patching import is_active, run_step, state, when_imported, wrap

ATTR_FETCHES = "tensorflow.session.fetches"
_MAX_KEY = 120
_MAX_NAMES = 16
# graph collections (tf.compat.v1.GraphKeys) -> the attribute naming each member's initializer
_INITIALIZERS = (
    ("variables", "initializer"),
    ("local_variables", "initializer"),
    ("model_variables", "initializer"),
    ("metric_variables", "initializer"),
    ("resources", "create"),  # resources.initialize_resources (part of Scaffold's init_op)
    ("local_resources", "create"),
    ("table_initializer", None),  # the ops themselves
)
_CHECK_TYPES = frozenset(("IsVariableInitialized", "VarIsInitializedOp"))
_MAX_VISIT = 10_000
_CACHE_ATTR = "_tf_otel_init_runs"


def _names(fetches: Any, out: List[str], depth: int = 0) -> None:
    if len(out) >= _MAX_NAMES or depth > 3:
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


# -- which runs are initialisation, not training ---------------------------------------------


def _initializer_names(graph: Any) -> FrozenSet[str]:
    """Names of the graph's variable / table initializer ops."""
    names = set()
    for key, attribute in _INITIALIZERS:
        for member in graph.get_collection(key):
            op = getattr(member, attribute, None) if attribute else member
            op = getattr(op, "op", op)  # a tensor's producing op
            name = getattr(op, "name", None)
            if isinstance(name, str):
                names.add(name)
    return frozenset(names)


class _Initializers:
    """The graph's initializer names, read once when first needed."""

    __slots__ = ("graph", "names", "visits")

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.names: Optional[FrozenSet[str]] = None
        self.visits = 0

    def is_initializer(self, op: Any, depth: int = 0) -> bool:
        self.visits += 1
        if self.visits > _MAX_VISIT or depth > 8:
            return False
        if self.names is None:
            self.names = _initializer_names(self.graph)
        if op.name in self.names:
            return True
        # tf.group(...) of initializers: a NoOp whose control inputs are all initializers
        # (per-device groups nest one level deeper)
        return op.type == "NoOp" and all(
            self.is_initializer(inner, depth + 1) for inner in op.control_inputs
        )


def _tensor_is_initialisation(tensor: Any, found: _Initializers) -> bool:
    """An initialisation check, or the output of a ref variable's initializer (Assign)."""
    kind = tensor.op.type
    return kind in _CHECK_TYPES or (kind == "Assign" and found.is_initializer(tensor.op))


def _other_is_initialisation(fetch: Any, graph: Any, found: _Initializers) -> bool:
    if isinstance(fetch, str):
        try:
            fetch = graph.as_graph_element(fetch)
        except Exception:  # noqa: BLE001 - a bad name fails in TF's own run, not here
            return False
        if hasattr(fetch, "op"):
            return _tensor_is_initialisation(fetch, found)
    if hasattr(fetch, "control_inputs") and hasattr(fetch, "type"):  # an Operation
        return found.is_initializer(fetch)
    return False


def _walk(fetches: Any, found: _Initializers, others: List[Any], depth: int = 0) -> bool:
    """Check tensors as met (a training run's loss ends it at once, without reading the
    graph's collections); collect operations and names for later. False: not initialisation."""
    if isinstance(fetches, dict):
        fetches = list(fetches.values())
    if isinstance(fetches, (list, tuple)):
        if depth > 3 or not fetches:
            return False
        return all(_walk(item, found, others, depth + 1) for item in fetches)
    # (hasattr of an attribute a Tensor lacks is slow: TF formats an error message for it)
    if hasattr(fetches, "op"):
        return _tensor_is_initialisation(fetches, found)
    others.append(fetches)
    return True


def _all_initialisation(fetches: Any, graph: Any, found: _Initializers) -> bool:
    """True when every fetch initialises (or checks the initialisation of) state."""
    others: List[Any] = []
    if not _walk(fetches, found, others):
        return False
    return all(_other_is_initialisation(other, graph, found) for other in others)


def is_initialisation_run(session: Any, fetches: Any, signature: str) -> bool:
    """Whether ``session.run(fetches)`` only initialises state (not a training step).

    Decided once per (session, signature) when the signature names every fetch; a longer
    fetch list is decided on each call (it stops at the first fetch that is not
    initialisation, so a training run costs one or two attribute reads)."""
    cache: Optional[Dict[str, bool]] = getattr(session, _CACHE_ATTR, None)
    if cache is not None:
        known = cache.get(signature)
        if known is not None:
            return known
    graph = getattr(session, "graph", None)
    if graph is None or not hasattr(graph, "get_collection"):
        return False
    try:
        result = _all_initialisation(fetches, graph, _Initializers(graph))
    except Exception as exc:  # noqa: BLE001 - never into training: then it is a step
        result = False
        report_failure("session.init_rule", exc)
    complete = len(signature) < _MAX_KEY and signature.count(",") < _MAX_NAMES - 1
    if complete:
        if cache is None:
            cache = {}
            try:
                setattr(session, _CACHE_ATTR, cache)
            except Exception:  # noqa: BLE001 - a session type without a __dict__
                return result
        if len(cache) < 4096:  # bounded: signatures are few in real programs
            cache[signature] = result
    return result


# -- the wrappers ----------------------------------------------------------------------------


def _session_step(
    wrapped: Callable,
    args: tuple,
    kwargs: dict,
    name: str,
    fetches: Any,
    session: Any,
    signature: Optional[str] = None,
) -> Any:
    if signature is None:
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
    if state.depth or not is_active():  # nested in a step or a MonitoredSession's set-up
        return wrapped(*args, **kwargs)
    fetches = args[0] if args else kwargs.get("fetches")
    signature = fetch_signature(fetches)
    if is_initialisation_run(instance, fetches, signature):
        return wrapped(*args, **kwargs)
    return _session_step(wrapped, args, kwargs, "Session.run", fetches, instance, signature)


def _not_a_step(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    """Session set-up / tear-down: the runs made inside it are not training steps."""
    state.depth += 1
    try:
        return wrapped(*args, **kwargs)
    finally:
        state.depth -= 1


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
    # every (re-)creation goes through _CoordinatedSessionCreator.create_session: the
    # SessionManager runs, the Scaffold's init_fn and hooks' after_create_session
    wrap(module._MonitoredSession._CoordinatedSessionCreator, "create_session", _not_a_step)
    wrap(module._MonitoredSession, "_close_internal", _not_a_step)  # hooks' end()


def _patch_session_manager(module: Any) -> None:
    for method in ("prepare_session", "recover_session", "wait_for_session"):
        wrap(module.SessionManager, method, _not_a_step)


def register(settings: Settings) -> None:
    when_imported("tensorflow.python.client.session", _patch_session)
    when_imported("tensorflow.python.training.monitored_session", _patch_monitored)
    when_imported("tensorflow.python.training.session_manager", _patch_session_manager)
