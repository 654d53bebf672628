"""Only training runs are steps: a MonitoredTrainingSession's start-up and close runs (init, ready
checks, restore, hooks' after_create_session / end), a plain session's initializer run and the
tf_keras v1 backend's initialisation runs are not; evaluation runs still are (the control).
Real TF in a subprocess, spans over real OTLP (tests/otlp_receiver.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import base_env, example, python, run

pytestmark = pytest.mark.integration

STEPS = 12
TRAIN = "Mean,GradientDescent"  # examples/tf1_session.py's sess.run([loss, train_op])


def _step_spans(receiver, expected: int):
    receiver.wait_for(lambda s: len([x for x in s if x.category == "step"]) >= expected, 20)
    spans = receiver.wait_for(lambda s: False, 1.5)  # anything more would be a wrong step
    return [s for s in spans if s.category == "step"]


def _by_fetches(steps):
    found = {}
    for s in steps:
        found.setdefault(s.attributes["tensorflow.session.fetches"], []).append(
            s.attributes["tf_otel.step"]
        )
    return {key: sorted(numbers) for key, numbers in found.items()}


@pytest.mark.parametrize(
    "extra, evaluations",
    [
        ({"MONITORED": "1"}, 0),  # StopAtStepHook: its after_create_session and after_run reads
        ({"MONITORED": "fixed", "EVAL": "1"}, 1),  # + checkpoint / summary hooks (below)
        ({"MONITORED": "0", "EVAL": "1"}, 1),  # plain Session: sess.run(init) before the loop
    ],
    ids=["monitored-stop-hook", "monitored-fixed-loop-checkpoints", "session-init-run"],
)
def test_only_training_and_evaluation_runs_are_steps(receiver, tmp_path: Path, extra, evaluations):
    if extra["MONITORED"] == "fixed":
        extra = dict(extra, CHECKPOINT_DIR=str(tmp_path / "ckpt"))
    env = base_env(**receiver.env("grpc"), TF_OTEL_ENABLED="1", STEPS=str(STEPS), **extra)
    result = run([python(), example("tf1_session.py")], env)
    assert f"done steps={STEPS}" in result.stdout, result.stdout[-2000:]
    steps = _step_spans(receiver, STEPS + evaluations)
    expected = {TRAIN: list(range(STEPS))}
    if evaluations:
        expected["Mean"] = [0]  # the user's evaluation run is a step of its own key
    assert _by_fetches(steps) == expected
    assert len(steps) == STEPS + evaluations
    if "CHECKPOINT_DIR" in extra:  # the hooks' own runs did happen: saved at creation and close
        index = {p.name for p in (tmp_path / "ckpt").glob("model.ckpt-*.index")}
        assert index == {"model.ckpt-0.index", f"model.ckpt-{STEPS}.index"}, index


KERAS_V1 = """
import os
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
import tf_keras as keras
x = np.random.default_rng(0).normal(size=(12 * 8, 4)).astype("float32")
model = keras.Sequential([keras.layers.Dense(8, "relu", input_shape=(4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, x.sum(axis=1, keepdims=True), batch_size=8, epochs=1, verbose=0)
print("done steps=12")
"""


def test_tf_keras_v1_backend_steps_are_its_train_callable_calls(receiver, tmp_path: Path):
    """tf_keras in graph mode trains through _make_callable_from_options (Session.callable);
    its variable-initialisation runs (is_variable_initialized checks, the initializer) are not
    steps."""
    script = tmp_path / "keras_v1.py"
    script.write_text(KERAS_V1)
    env = base_env(**receiver.env("grpc"), TF_OTEL_ENABLED="1")
    result = run([python(), str(script)], env)
    assert "done steps=12" in result.stdout, result.stdout[-2000:]
    steps = _step_spans(receiver, STEPS)
    assert {s.name for s in steps} == {"rank 0 Session.callable"}, {s.name for s in steps}
    assert [numbers for numbers in _by_fetches(steps).values()] == [list(range(STEPS))]


def test_initialisation_rule_reads_the_graph_not_op_types():
    """In process, real TF graph: initializers (any grouping, by object or by name), table
    initializers and initialisation checks are initialisation; a training update made of plain
    ``assign`` ops, a fetched variable value, a mix, an empty fetch are not."""
    tf = pytest.importorskip("tensorflow")
    from tf_otel.instrument.session import fetch_signature, is_initialisation_run

    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.get_variable("v", [3], use_resource=False)  # ref variable: Assign
        r = tf.compat.v1.get_variable("r", [3], use_resource=True)  # AssignVariableOp
        local = tf.compat.v1.get_variable("l", [2], collections=["local_variables"])
        keys = tf.constant(["a", "b"])
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(keys, tf.constant([1, 2])), -1
        )
        del table
        init = tf.compat.v1.global_variables_initializer()
        with tf.device("/cpu:0"):
            grouped = tf.group(v.initializer, local.initializer, name="my_init")
        checks = [tf.compat.v1.is_variable_initialized(x) for x in (v, r, local)]
        custom_update = tf.group(tf.compat.v1.assign(v, v * 0.5), name="custom_sgd")
        v1 = tf.compat.v1
        everything = [init, v1.local_variables_initializer(), v1.tables_initializer()]
        cases = {
            "global init": (init, True),
            "global + local + tables": (everything, True),
            "group by name": ("my_init", True),
            "dict of initializers": ({"a": grouped, "b": r.initializer}, True),
            "initialisation checks": (checks, True),
            "ref initializer's output tensor": (v.initializer.outputs[0], True),
            "assign-based training op": (custom_update, False),
            "a plain assign": (tf.compat.v1.assign(v, v + 1.0), False),
            "a variable's value": (r.read_value(), False),
            "init and a value": ([init, r.read_value()], False),
            "nothing": ([], False),
        }
    session = tf.compat.v1.Session(graph=graph)
    try:
        for name, (fetches, expected) in cases.items():
            signature = fetch_signature(fetches)
            assert is_initialisation_run(session, fetches, signature) is expected, name
            assert is_initialisation_run(session, fetches, signature) is expected, name  # cached
    finally:
        session.close()
