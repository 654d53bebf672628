"""Pure parsers of op traces: RecvTensor labels, step_stats on a real StepStats message, the cap,
and the on-demand controller's step arithmetic."""

from __future__ import annotations

import pytest

from tf_otel.instrument.ops.hook import OpsController
from tf_otel.record import COMPUTE, FRAMEWORK, INPUT, TRANSFER, Record
from tf_otel.sources.step_stats import (
    ATTR_BYTES,
    ATTR_OPS_DROPPED,
    ATTR_OPS_DROPPED_NS,
    ATTR_OPS_KEPT,
    ATTR_OPS_TOTAL,
    cap_records,
    op_type,
    parse_recv_label,
    step_stats_capped,
    step_stats_records,
)

LABEL = (
    "[8192B] [129.0Mb/s] edge_5_MatMul/ReadVariableOp from "
    "/job:ps/replica:0/task:0/device:CPU:0 to /job:worker/replica:0/task:1/device:CPU:0"
)


def test_recv_label_gives_src_dst_bytes_edge_rate():
    attrs = parse_recv_label(LABEL)
    assert attrs == {
        "tensorflow.transfer.src": "/job:ps/replica:0/task:0/device:CPU:0",
        "tensorflow.transfer.dst": "/job:worker/replica:0/task:1/device:CPU:0",
        "tensorflow.transfer.bytes": 8192,
        "tensorflow.transfer.edge": "edge_5_MatMul/ReadVariableOp",
        "tensorflow.transfer.rate_mbps": 129.0,
    }
    assert parse_recv_label(LABEL.replace("129.0Mb/s", "2.5Gb/s"))[
        "tensorflow.transfer.rate_mbps"
    ] == pytest.approx(2500.0)
    assert parse_recv_label("MatMul = MatMul(a, b)") is None


def test_op_type_from_label_or_name():
    assert op_type("MatMul_1 = MatMul(x, w/read)", "MatMul_1") == "MatMul"
    assert op_type("", "gradients/Square_grad/Mul:0") == "Mul"


def test_step_stats_message_to_records():
    from tensorflow.core.framework import step_stats_pb2

    stats = step_stats_pb2.StepStats()
    worker = stats.dev_stats.add(device="/job:worker/replica:0/task:0/device:CPU:0")
    for name, label, start_us, rel_us in (
        ("_SOURCE", "_SOURCE = NoOp()", 1_000, 1),
        ("MatMul", "MatMul = MatMul(x, w)", 1_000_010, 30),
        ("IteratorGetNext", "IteratorGetNext = IteratorGetNext(it)", 1_000_000, 9),
    ):
        worker.node_stats.add(
            node_name=name, timeline_label=label, all_start_micros=start_us,
            op_end_rel_micros=rel_us,
        )  # fmt: skip
    recv = stats.dev_stats.add(device="/job:worker/replica:0/task:0/device:CPU:0/RecvTensor")
    recv.node_stats.add(
        node_name="RecvTensor", timeline_label=LABEL, all_start_micros=999_990, all_end_rel_micros=7
    )
    records = step_stats_records(stats, step=4)
    assert [(r.category, r.name) for r in records] == [
        (TRANSFER, "RecvTensor edge_5_MatMul/ReadVariableOp"),
        (INPUT, "IteratorGetNext:IteratorGetNext"),
        (COMPUTE, "MatMul:MatMul"),
    ]
    matmul = records[2]
    assert (matmul.start_ns, matmul.end_ns) == (1_000_010_000, 1_000_040_000)
    assert matmul.attributes["tensorflow.device"] == worker.device
    assert (
        records[0].attributes[ATTR_BYTES] == 8192
        and records[0].end_ns - records[0].start_ns == 7000
    )
    assert {r.step for r in records} == {4}


def test_cap_keeps_the_longest_and_summarises_the_rest():
    records = [Record(f"op{i}", 1000 * i, 1000 * i + 10 * i, COMPUTE) for i in range(1, 101)]
    capped = cap_records(records, limit=10, step=3)
    summary, kept = capped[0], capped[1:]
    assert summary.category == FRAMEWORK and summary.step == 3
    assert sorted(r.name for r in kept) == sorted(f"op{i}" for i in range(91, 101))
    assert [r.start_ns for r in kept] == sorted(r.start_ns for r in kept)
    assert summary.attributes[ATTR_OPS_TOTAL] == 100
    assert summary.attributes[ATTR_OPS_KEPT] == 10
    assert summary.attributes[ATTR_OPS_DROPPED] == 90
    assert summary.attributes[ATTR_OPS_DROPPED_NS] == sum(10 * i for i in range(1, 91))
    assert (summary.start_ns, summary.end_ns) == (1000, 100_000 + 1000)
    assert len(cap_records(records, limit=0)) == 101  # no cap: everything plus the summary


def _fields(r: Record) -> tuple:
    return (r.name, r.start_ns, r.end_ns, r.category, r.step, r.attributes)


def _longer(records: list, cut: int) -> list:
    return sorted(_fields(r) for r in records if r.end_ns - r.start_ns > cut)


def test_capped_fast_path_equals_records_then_cap_on_a_real_trace():
    """step_stats_capped (picks the longest from raw durations) == cap_records(records), on the
    FULL_TRACE step_stats of a real ~1k-op while loop, capped and uncapped."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        a = tf.compat.v1.placeholder(tf.float32, [4])
        body = lambda i, a: (i + 1, tf.tanh(a * 1.0001 + 0.5))  # noqa: E731
        out = tf.compat.v1.while_loop(lambda i, a: i < 50, body, [tf.constant(0), a])[1]
    metadata = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(graph=graph) as sess:
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        sess.run(out, {a: [1.0] * 4}, options=options, run_metadata=metadata)
    stats = metadata.step_stats
    records = step_stats_records(stats, step=2)
    assert len(records) > 500
    for limit in (0, 40, len(records) - 1):
        fast = step_stats_capped(stats, 2, limit)
        slow = cap_records(records, limit, 2)
        assert _fields(fast[0]) == _fields(slow[0])  # the summary
        # same kept set (ties at the cut may pick other ops of the same duration)
        cut = min(r.end_ns - r.start_ns for r in slow[1:])
        assert _longer(fast[1:], cut) == _longer(slow[1:], cut)
        assert len(fast) == len(slow)
        assert [r.start_ns for r in fast[1:]] == sorted(r.start_ns for r in fast[1:])
    assert step_stats_capped(type(stats)(), 2, 10) == []


def test_controller_every_n_and_windows():
    c = OpsController(every=10)
    assert [s for s in range(35) if c.wanted("k", s)] == [0, 10, 20, 30]
    c.every = 0
    for step in range(8):
        c.seen("k", step)
    starts = c.decide(4)
    assert starts["k"] >= 8 + 3  # after the current step, at least the margin
    c.apply(starts, 4)
    s = starts["k"]
    assert [x for x in range(5000) if c.wanted("k", x)] == list(range(s, s + 4))
    assert not c.wanted("other", s)
