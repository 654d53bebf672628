"""Input wait of every step, whatever consumes the dataset: Keras ``fit`` / ``evaluate`` /
``predict`` (whose ``get_next`` runs inside the compiled train function), ``next(it)`` inside a
user ``tf.function``, or eager ``next()`` in a custom loop.

Every iterator made eagerly from a ``tf.data.Dataset`` (``DatasetV2.__iter__``, which Keras 3,
tf_keras and custom loops all call) iterates a dataset with a short timing tail appended:

    zip(timestamp(), user_dataset) -> map(wait += timestamp() - t0; count += 1; return element)

``zip`` pulls its inputs in order, so ``t0`` is taken when the consumer asks for an element and
the map runs when the user pipeline hands it over: the difference is exactly the time the
consumer was blocked on the input pipeline, measured inside tf.data with no Python and no GIL.
The tail is synchronous (``inject_prefetch`` off for it, the user's own prefetch untouched), so
it runs on the consumer's thread. One process-wide int64 variable [wait_ns, elements] holds the
sums; the step hook reads it once per step end (one eager read) and puts the delta since the
previous step end on the step span (``tf_otel.input.wait_ns``, ``tf_otel.input.share``,
``tf_otel.input.elements``) and, for every step, sampled or not, into the
``tf_otel.step.input_wait.duration`` histogram (pipeline/step_metrics.py); waits between
steps (eager ``next()`` before a step) belong to the next step. Element values are never
read: only the two timestamps.

Cost: see docs/WHOLE_STEP.md and bench/bench_input_wait.py. ``TF_OTEL_INPUT_WAIT=0`` turns it off.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from tf_otel import clock, record
from tf_otel.config import Settings
from tf_otel.health import count, fail_open
from tf_otel.instrument._patching import StepCall, StepHook, add_step_hook, when_imported
from tf_otel.instrument._patching import wrap as _wrap
from tf_otel.pipeline.step_metrics import FLAG_INPUT_WAIT
from tf_otel.record import INPUT, Record

ATTR_WAIT = record.ATTR_INPUT_WAIT
ATTR_SHARE = "tf_otel.input.share"
ATTR_ELEMENTS = record.ATTR_INPUT_ELEMENTS
SPAN_NAME = "input wait (tf.data)"
# an ``input`` span under the step only where the wait is worth looking at (XProf's lower grade)
SPAN_MIN_SHARE = 0.05
SPAN_MIN_NS = 100_000

_state: Dict[str, Any] = {}  # "totals": the ResourceVariable, "read": its eager read


def _totals(tf: Any) -> Any:
    totals = _state.get("totals")
    if totals is None:
        from tensorflow.python.ops import resource_variable_ops

        # a plain ResourceVariable, made outside any function or distribution strategy scope:
        # strategies' variable creators must not mirror it, Keras must not track it
        with tf.init_scope(), tf.device("/cpu:0"):
            totals = resource_variable_ops.ResourceVariable(
                tf.zeros([2], tf.int64), trainable=False, name="tf_otel_input_wait"
            )
        _state["totals"] = totals
        _state["last"] = (0, 0)
    return totals


def timed_dataset(dataset: Any) -> Any:
    """``dataset`` with the timing tail; the same element structure and cardinality."""
    import tensorflow as tf

    totals = _totals(tf)

    def stamp(_: Any) -> Any:
        return tf.cast(tf.timestamp() * 1e9, tf.int64)

    def arrived(t0: Any, element: Any) -> Any:
        waited = tf.cast(tf.timestamp() * 1e9, tf.int64) - t0
        with tf.control_dependencies([totals.assign_add(tf.stack([waited, 1]))]):
            return tf.nest.map_structure(tf.identity, element, expand_composites=True)

    clock_ds = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat().map(stamp)
    tail = tf.data.Dataset.zip((clock_ds, dataset)).map(arrived)
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # the tail runs on the consumer
    tail = tail.with_options(options)
    tail._tf_otel_timed = True
    return tail


def _iter_wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    if getattr(instance, "_tf_otel_timed", False) or not _eager_now():
        return wrapped(*args, **kwargs)
    tail = None
    with fail_open("input_wait.dataset"):
        tail = timed_dataset(instance)
    if tail is None:
        return wrapped(*args, **kwargs)
    return iter(tail)


_eager: List[Callable[[], bool]] = []


def _eager_now() -> bool:
    return bool(_eager) and _eager[0]()


class InputWaitHook(StepHook):
    """Reads the totals once per step end; the delta since the last read is this step's."""

    def on_step_end(self, handle: Any, call: StepCall, error: Optional[BaseException]) -> None:
        totals = _state.get("totals")
        if totals is None or not _eager_now():
            return
        wait_ns, elements = (int(v) for v in totals.numpy())
        last_wait, last_elements = _state["last"]
        _state["last"] = (wait_ns, elements)
        wait = max(0, wait_ns - last_wait)
        # every step, sampled or not: the input wait histogram (pipeline.step_metrics)
        handle.flags[FLAG_INPUT_WAIT] = wait
        if not handle.sampled:
            return
        end = clock.now_ns()
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

    _eager[:] = [context.executing_eagerly]
    _wrap(module.DatasetV2, "__iter__", _iter_wrapper)


def register(settings: Settings) -> None:
    if not settings.input_wait:
        return
    add_step_hook(hook)
    when_imported("tensorflow.python.data.ops.dataset_ops", _patch)
