"""A TF1 run built ahead without running it (graph_stamps.build, issue 45): real TensorFlow,
one process. The run's ops would move a counter and its feeds are of three types (float, int,
string); after the build the counter has not moved; the program's own run then runs once.
A run TensorFlow cannot build fails the build (the caller gives its stamps up)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf

from tf_otel.instrument.horovod import graph_stamps

v1 = tf.compat.v1


def _graph():
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        n = v1.placeholder(tf.int64, [], name="n")
        label = v1.placeholder(tf.string, [None], name="label")
        counter = v1.get_variable("counter", [], tf.int64, initializer=v1.zeros_initializer())
        total = tf.reduce_sum(x) + tf.cast(n, tf.float32) + tf.cast(tf.size(label), tf.float32)
        bump = v1.assign_add(counter, 1)
        stamp = tf.timestamp()
        init = v1.global_variables_initializer()
    return graph, (x, n, label), counter, total, bump, stamp, init


def test_a_run_built_ahead_runs_nothing_and_the_program_run_still_runs_once():
    graph, (x, n, label), counter, total, bump, stamp, init = _graph()
    with v1.Session(graph=graph) as session:
        session.run(init)
        feeds = [(x, np.dtype("float32"), 2), (n, np.dtype("int64"), 0), (label, object, 1)]
        errors = []

        def build():
            try:
                graph_stamps.build(session, [bump.op], [total, stamp], feeds)
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        thread = threading.Thread(target=build)  # as the twin thread does
        thread.start()
        thread.join()
        assert not errors, errors
        assert session.run(counter) == 0, "the build ran the run"
        value, when = session.run(
            [total, stamp],
            {x: np.ones([2, 4], np.float32), n: 3, label: [b"a", b"b"]},
        )
        session.run(bump)
        assert value == pytest.approx(13.0) and when > 0
        assert session.run(counter) == 1


def test_a_run_tensorflow_cannot_build_fails_the_build():
    graph, (x, n, label), counter, total, bump, stamp, init = _graph()
    config = v1.ConfigProto(allow_soft_placement=False)
    with v1.Session(graph=graph, config=config) as session:
        session.run(init)
        with graph.as_default(), tf.device("/device:CPU:7"):  # no such device: placement fails
            misplaced = tf.identity(stamp)
        with pytest.raises(tf.errors.InvalidArgumentError) as failed:
            graph_stamps.build(session, [bump.op], [misplaced], [])
        assert "inter_op_thread_pool" not in str(failed.value)  # the run's own error
