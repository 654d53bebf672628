"""TF2 ParameterServerStrategy: each closure a ``ClusterCoordinator`` runs on a remote worker is a
step of the coordinator (chief) process, with the worker it ran on.

    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    coordinator.schedule(train_step, args=(iterator,))   # -> one step span per closure

Step key ``ps_closure:<function>``, kind ``tf_function``, name ``closure <function>``, attributes
``tensorflow.ps.worker`` (device name, e.g. ``/job:worker/replica:0/task:1``) and
``tensorflow.ps.worker_index``. Closures run on the coordinator's worker threads, one per remote
worker, so several steps may be open at once. Op tracing does not apply (the ops run in the
worker processes); TF1 ``tf.distribute.Server`` clusters are traced by session.py / ops/hook.py.
``ResourceClosure``s (per-worker datasets and resources, built once) are not steps.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from tf_otel import record
from tf_otel.config import Settings
from tf_otel.instrument._patching import run_step, when_imported, wrap

KEY_PREFIX = "ps_closure:"
ATTR_WORKER = "tensorflow.ps.worker"
ATTR_WORKER_INDEX = "tensorflow.ps.worker_index"
_INFERENCE = re.compile(r"^__inference_(.*?)(_\d+)?$")


def closure_name(closure: Any) -> str:
    concrete = getattr(closure, "_concrete_function", None)
    name = getattr(concrete, "name", None)
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    if not name:
        function = getattr(closure, "_function", None)
        name = getattr(function, "__name__", None) or type(function).__name__
    m = _INFERENCE.match(name)
    return m.group(1) if m else name


def _execute_on_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    if _resource and isinstance(instance, _resource[0]):
        return wrapped(*args, **kwargs)
    worker = args[0] if args else kwargs.get("worker")
    name = closure_name(instance)
    attributes = {
        ATTR_WORKER: str(getattr(worker, "device_name", "?")),
        ATTR_WORKER_INDEX: int(getattr(worker, "worker_index", -1)),
        record.ATTR_FUNCTION_NAME: name,
    }
    return run_step(
        wrapped,
        args,
        kwargs,
        KEY_PREFIX + name,
        f"closure {name}",
        record.TF_FUNCTION,
        attributes,
        instance,
    )


_resource: list = []  # [ResourceClosure]


def _patch(module: Any) -> None:
    resource = getattr(module, "ResourceClosure", None)
    _resource[:] = [resource] if resource is not None else []
    wrap(module.Closure, "execute_on", _execute_on_wrapper)


def register(settings: Settings) -> None:
    when_imported("tensorflow.python.distribute.coordinator.cluster_coordinator", _patch)
