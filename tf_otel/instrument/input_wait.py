"""Input wait of every step: the time the consumer of a tf.data pipeline was blocked on it,
measured inside tf.data, with no Python and no GIL on the way.

The dataset is iterated with a short timing tail appended::

    zip(timestamp(), user_dataset) -> map(wait += timestamp() - t0; count += 1; return element)

``zip`` pulls its inputs in order, so ``t0`` is taken when the consumer asks for an element and
the map runs when the user pipeline hands it over. Both tail functions run inline on the
consumer's thread (``use_inter_op_parallelism=False``: a hop to the inter-op pool cost ~0.2 ms a
batch and read a descheduled consumer as waiting). The sums live in a hash table found by its
shared name, never captured, so a tf.function that iterates a dataset stays exportable. The step
hook reads them once per step end and puts the delta, less the tail's own floor (measured once
per process), on the step span (``tf_otel.input.*``) and into the
``tf_otel.step.input_wait.duration`` histogram. Element values are never read.

Where (``TF_OTEL_INPUT_WAIT`` unset): the iterators Keras ``fit`` / ``evaluate`` / ``predict``
make, and datasets iterated inside a ``tf.function`` traced during a step. ``1``: also every
other iterator (``DatasetV2.__iter__``); not the default because the tail makes the iterator's
dataset stateful, which tf.data refuses to checkpoint. ``0``: off. Never for a dataset already
placed off the CPU. Design and cost: docs/guides/WHOLE_STEP.md, docs/benchmarks/input_wait.md.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional

from tf_otel import clock, record
from tf_otel.config import Settings
from tf_otel.health import count, fail_open
from tf_otel.instrument._patching import (
    Error,
    HookOrder,
    StepCall,
    StepHook,
    add_step_hook,
    state,
    when_imported,
)
from tf_otel.instrument._patching import wrap as _wrap
from tf_otel.record import INPUT, Record
from tf_otel.step_handle import StepHandle

ATTR_WAIT = record.ATTR_INPUT_WAIT
ATTR_SHARE = "tf_otel.input.share"
ATTR_ELEMENTS = record.ATTR_INPUT_ELEMENTS
SPAN_NAME = "input wait (tf.data)"
# an ``input`` span under the step only where the wait is worth looking at (XProf's lower grade)
SPAN_MIN_SHARE = 0.05
SPAN_MIN_NS = 100_000
CALIBRATION_ELEMENTS = 64  # elements of a never-blocking source timed once: the tail's floor

TABLE = "tf_otel_input_wait"  # the totals' shared name (_table)

# "reader": the totals' eager handle, key and default; "last": their previous read;
# "floor_ns": the tail's own reading an element; "clock": the eager timestamp dataset
_state: Dict[str, Any] = {}


class _Tracing(threading.local):
    data_functions = 0  # > 0 while tf.data traces one of its functions on this thread


_tracing = _Tracing()


def _inline_map(tf: Any, dataset: Any, fn: Callable) -> Any:
    """``dataset.map(fn)`` whose function runs on the calling thread (single-threaded executor)."""
    try:
        from tensorflow.python.data.ops import map_op

        return map_op._MapDataset(dataset, fn, use_inter_op_parallelism=False)
    except (ImportError, AttributeError, TypeError):  # another TF: the public map, a hop dearer
        count("input_wait_public_map")
        return dataset.map(fn)


def _clock(tf: Any) -> Any:
    """An endless dataset of timestamps (ns), each taken when an element is asked for; made
    once for eager pipelines (one function trace fewer for every tail)."""
    eager = tf.executing_eagerly()
    if eager and "clock" in _state:
        return _state["clock"]

    def stamp(_: Any) -> Any:
        return tf.cast(tf.timestamp() * 1e9, tf.int64)

    ticks = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat()
    clock_ds = _inline_map(tf, ticks, stamp)
    if eager:
        _state["clock"] = clock_ds
    return clock_ds


def _tail(tf: Any, dataset: Any, arrived: Callable) -> Any:
    """zip(t0 at the consumer's request, dataset).map(arrived(waited_ns, element))."""

    def on_arrival(t0: Any, element: Any) -> Any:
        return arrived(tf.cast(tf.timestamp() * 1e9, tf.int64) - t0, element)

    tail = _inline_map(tf, tf.data.Dataset.zip((_clock(tf), dataset)), on_arrival)
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # the tail runs on the consumer
    return tail.with_options(options)


def _calibrate(tf: Any) -> int:
    """The tail's own reading an element (ns): the median over a source that never blocks."""
    import numpy as np

    ready = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat()
    readings = _tail(tf, ready, lambda waited, _: waited)
    readings = readings.take(CALIBRATION_ELEMENTS).batch(CALIBRATION_ELEMENTS)
    readings._tf_otel_timed = True
    return max(0, int(np.median(next(iter(readings)).numpy())))


def _table(tf: Any) -> Any:
    """The totals' handle: a hash table of one int64 [wait_ns, elements] found (or made) by its
    shared name in this process's CPU resources. Looked up by name where it is used, never
    captured: a tf.function that iterates a dataset can still be exported and loaded elsewhere
    (where the op makes an unread table of its own); a variable would be a capture there."""
    from tensorflow.python.ops import gen_lookup_ops

    return gen_lookup_ops.mutable_hash_table_of_tensors_v2(
        key_dtype=tf.int64,
        value_dtype=tf.int64,
        value_shape=[2],
        shared_name=TABLE,
        use_node_name_sharing=False,
    )


def _add(tf: Any, waited: Any) -> Any:
    from tensorflow.python.ops import gen_lookup_ops

    table = _table(tf)
    key = tf.constant(0, tf.int64)
    totals = gen_lookup_ops.lookup_table_find_v2(table, key, tf.zeros([2], tf.int64))
    added = totals + tf.stack([waited, tf.constant(1, tf.int64)])
    return gen_lookup_ops.lookup_table_insert_v2(table, key, added)


def _prepare(tf: Any) -> None:
    """Once per process, eagerly: the reader's handle and the tail's floor."""
    if "reader" in _state:
        return
    with tf.init_scope(), tf.device("/cpu:0"):
        reader = (_table(tf), tf.constant(0, tf.int64), tf.constant([0, 0], tf.int64))
        floor = 0
        with fail_open("input_wait.calibrate"):
            floor = _calibrate(tf)
    _state["floor_ns"] = floor
    _state["last"] = (0, 0)
    _state["reader"] = reader


def read_totals() -> Optional[tuple]:
    """(wait_ns, elements) summed over every timed element so far; None before the first tail."""
    reader = _state.get("reader")
    if reader is None:
        return None
    from tensorflow.python.ops import gen_lookup_ops

    # one eager op (~20 us); the key and default are made once (an eager tf.zeros is ~0.1 ms)
    wait_ns, elements = gen_lookup_ops.lookup_table_find_v2(*reader).numpy()
    return int(wait_ns), int(elements)


def floor_ns() -> int:
    """The tail's own reading an element, subtracted from every step's wait (0 before any)."""
    return int(_state.get("floor_ns", 0))


def timed_dataset(dataset: Any) -> Any:
    """``dataset`` with the timing tail; the same element structure and cardinality."""
    import tensorflow as tf

    _prepare(tf)

    def arrived(waited: Any, element: Any) -> Any:
        with tf.control_dependencies([_add(tf, waited)]):
            return tf.nest.map_structure(tf.identity, element, expand_composites=True)

    tail = _tail(tf, dataset, arrived)
    tail._tf_otel_timed = True
    return tail


def _on_cpu(dataset: Any) -> bool:
    device = getattr(getattr(dataset, "_variant_tensor", None), "device", "") or ""
    return not device or "CPU" in device.upper()


def _wanted(dataset: Any) -> bool:
    """Whether iterating ``dataset`` here should be timed (see the module docstring)."""
    if getattr(dataset, "_tf_otel_timed", False) or not _eager:
        return False
    if _eager[0]():  # Keras fit / evaluate / predict; any iterator with TF_OTEL_INPUT_WAIT=1
        if not (state.keras_loop or _scope["every_iterator"]):
            return False
    elif _tracing.data_functions or not state.depth or not _inside_function[0]():
        return False  # tracing a function: a user tf.function traced during a step only
    return _on_cpu(dataset)


def _iter_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    seen.set()
    tail = None
    with fail_open("input_wait.dataset"):
        if _wanted(instance):
            eager = _eager[0]()
            # a dataset iterated again (Keras: every epoch) reuses its tail: no new traces
            tail = getattr(instance, "_tf_otel_tail", None) if eager else None
            if tail is None:
                tail = timed_dataset(instance)
                if eager:
                    instance._tf_otel_tail = tail
    if tail is None:
        return wrapped(*args, **kwargs)
    return iter(tail)


def _for_stmt_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    """AutoGraph's ``for x in dataset`` (a scan + reduce in the graph): the dataset timed."""
    seen.set()
    if args:
        tail = None
        with fail_open("input_wait.for_loop"):
            if _wanted(args[0]):
                tail = timed_dataset(args[0])
        if tail is not None:
            args = (tail,) + tuple(args[1:])
    return wrapped(*args, **kwargs)


def _data_function_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    _tracing.data_functions += 1
    try:
        return wrapped(*args, **kwargs)
    finally:
        _tracing.data_functions -= 1


_eager: List[Callable[[], bool]] = []
_inside_function: List[Callable[[], bool]] = [lambda: False]
# set once any tf.data dataset is iterated in this process (here, or eager next(): data.py)
seen = threading.Event()
_scope: Dict[str, bool] = {"every_iterator": False}


def _eager_now() -> bool:
    return bool(_eager) and _eager[0]()


class InputWaitHook(StepHook[None]):
    """Reads the totals once per step end; the delta since the last read is this step's."""

    order = HookOrder.INPUT_WAIT

    def on_step_end(self, handle: StepHandle, call: StepCall, error: Error, kept: None) -> None:
        if not seen.is_set() and handle.sampled and call.kind != record.SESSION_RUN:
            # no dataset iterated in this process yet: no tf.data input to measure (a TF1
            # graph's iterators are made without __iter__: never claimed for Session.run)
            handle.attributes[record.ATTR_INPUT_SEEN] = False
        if "reader" not in _state or not _eager_now():
            return
        totals = read_totals()
        if totals is None:
            return
        wait_ns, elements = totals
        last_wait, last_elements = _state["last"]
        _state["last"] = (wait_ns, elements)
        if elements == last_elements:
            # no timed element in this step (a custom loop's own iterator, whose eager next()
            # instrument/data.py times): not measured here, not 0
            return
        # less the tail's own reading of each element (measured: _calibrate)
        wait = max(0, wait_ns - last_wait - floor_ns() * (elements - last_elements))
        # every step, sampled or not: the input wait histogram (metrics.step_metrics)
        handle.input_wait_ns = wait
        if not handle.sampled:
            return
        end = handle.end_ns or clock.now_ns()  # the step span's own end
        duration = max(1, end - handle.start_ns)
        share = min(1.0, wait / duration)
        handle.attributes[ATTR_WAIT] = wait
        handle.attributes[ATTR_SHARE] = round(share, 4)
        handle.attributes[ATTR_ELEMENTS] = elements - last_elements
        if share >= SPAN_MIN_SHARE and wait >= SPAN_MIN_NS:
            start = handle.start_ns

            def produce() -> List[Record]:
                # eager next() waits already have their own spans (instrument/data.py)
                if any(r.category == INPUT for r in handle.records):
                    return []
                count("input_wait_spans")
                return [
                    Record(
                        SPAN_NAME,
                        start,
                        min(start + wait, end),
                        INPUT,
                        handle.step,
                        {record.ATTR_CATEGORY: INPUT},
                    )
                ]

            handle.deferred.append(produce)


hook = InputWaitHook()


def _patch(module: Any) -> None:
    from tensorflow.python.eager import context
    from tensorflow.python.framework import ops

    _eager[:] = [context.executing_eagerly]
    _inside_function[:] = [ops.inside_function]
    _wrap(module.DatasetV2, "__iter__", _iter_wrapper)
    with fail_open("input_wait.autograph"):
        _patch_autograph(module)


def _patch_autograph(module: Any) -> None:
    """``for x in dataset`` in a tf.function: AutoGraph looks the loop up in a type registry
    that holds the function itself; the entry becomes a trampoline to the module attribute,
    which is wrapped (and unwrapped by uninstrument) like any other."""
    from tensorflow.python.autograph.operators import control_flow
    from tensorflow.python.data.ops import dataset_autograph, structured_function

    _wrap(structured_function.StructuredFunctionWrapper, "__init__", _data_function_wrapper)
    registry = control_flow.for_loop_registry._registry
    if registry.get(module.DatasetV2) is not dataset_autograph._tf_ag_dataset_for_stmt:
        return  # another TF, or already done

    def dataset_for_stmt(*args: Any, **kwargs: Any) -> Any:
        return dataset_autograph._tf_ag_dataset_for_stmt(*args, **kwargs)

    registry[module.DatasetV2] = dataset_for_stmt
    _wrap(dataset_autograph, "_tf_ag_dataset_for_stmt", _for_stmt_wrapper)


def register(settings: Settings) -> None:
    if settings.input_wait is False:
        return
    _scope["every_iterator"] = settings.input_wait is True
    add_step_hook(hook)
    when_imported("tensorflow.python.data.ops.dataset_ops", _patch)
