"""The program's own ``hvd.allreduce`` calls inside one tf.function (not wrapped in Horovod's
``tf.cond`` as DistributedGradientTape does), for the stamp-ordering and detail-twin tests.

Prints one JSON line per rank (``GRAPHS {...}``) describing the traced graphs:
- ``program_timing_ops``: timing ops (Timestamp, tf_otel's stamp calls) in the program's own
  trace of ``train_step`` (must be 0: steps without detail run exactly the program's graph);
- ``twin_timing_ops``: the same in the detail twin's trace (> 0 where detail is on);
- ``ordered_pairs``: pairs of collectives in the twin's graph where one is an ancestor of the
  other (must be 0: the stamps add no order between independent collectives).
"""

import json
import os

import horovod.tensorflow as hvd
import tensorflow as tf

hvd.init()
STEPS = int(os.environ.get("STEPS", "6"))
CALLS = 5
tensors = [tf.fill([64 + i], float(hvd.rank() + i)) for i in range(CALLS)]


@tf.function
def train_step():
    return [hvd.allreduce(t, name=f"direct_{i}") for i, t in enumerate(tensors)]


for _ in range(STEPS):
    train_step()


def ancestors(op, seen):
    stack = [t.op for t in op.inputs] + list(op.control_inputs)
    while stack:
        parent = stack.pop()
        if parent.name in seen:
            continue
        seen.add(parent.name)
        stack.extend([t.op for t in parent.inputs] + list(parent.control_inputs))
    return seen


def timing_ops(graph):
    return sum(
        op.type == "Timestamp"
        or ("arrive" in op.get_attr("f").name if op.type.endswith("PartitionedCall") else False)
        for op in graph.get_operations()
    )


def graph_of(function):
    concrete = function._list_all_concrete_functions_for_serialization() or []
    if not concrete:
        concrete = [function.get_concrete_function()]
    return concrete[0].graph


report = {"rank": hvd.rank(), "program_timing_ops": timing_ops(graph_of(train_step))}
twin = getattr(train_step, "_tf_otel_twin", None)
if twin is not None:
    graph = graph_of(twin)
    collectives = [op for op in graph.get_operations() if op.type.startswith("Horovod")]
    names = {op.name for op in collectives}
    pairs = sum(len(ancestors(op, set()) & names) for op in collectives)
    report.update(
        twin_timing_ops=timing_ops(graph), twin_collectives=len(collectives), ordered_pairs=pairs
    )
print("GRAPHS " + json.dumps(report), flush=True)
print(f"rank {hvd.rank()} done", flush=True)
