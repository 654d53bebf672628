"""Fuzzed step_stats parsing: timeline labels and RecvTensor labels of any text, and StepStats
protos with odd field values. The contract: never raise (a label that is not a RecvTensor label
gives None; every node execution gives a Record), in bounded time.

The StepStats protos are real ``tensorflow`` messages (TF is imported once, in this process).
"""

from __future__ import annotations

import string

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tensorflow.core.framework import step_stats_pb2  # before hypothesis runs

from tf_otel.sources.step_stats import (
    ATTR_BYTES,
    ATTR_RATE,
    op_type,
    parse_recv_label,
    step_stats_capped,
    step_stats_records,
)

FUZZ = settings(
    max_examples=300,
    deadline=2000,  # ms per example: generous for a loaded 2-core machine, still "bounded"
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

# near-misses of "[8192B] [129.0Mb/s] edge_5_MatMul/ReadVariableOp from /job:ps/... to /job:..."
_digits = st.text(alphabet="0123456789", min_size=0, max_size=12) | st.just("1" * 5000)
_rate = st.text(alphabet="0123456789.", min_size=0, max_size=8) | st.sampled_from(
    ["129.0", "1.2.3", ".", "..", "1e9", "nan", "inf"]
)
_word = st.text(min_size=0, max_size=20) | st.sampled_from(
    ["edge_5_MatMul/ReadVariableOp", "/job:ps/replica:0/task:0/device:CPU:0"]
)
_sep = st.sampled_from([" ", "  ", "\t", "", "\n", "\u00a0"])


@st.composite
def recv_labels(draw):
    unit = draw(st.sampled_from(["b", "Kb", "Mb", "Gb", "Tb", "", "B"]))
    parts = [
        f"[{draw(_digits)}B]",
        draw(_sep),
        f"[{draw(_rate)}{unit}/s]",
        draw(_sep),
        draw(_word),
        draw(_sep),
        draw(st.sampled_from(["from", "fro", ""])),
        draw(_sep),
        draw(_word),
        draw(_sep),
        draw(st.sampled_from(["to", ""])),
        draw(_sep),
        draw(_word),
    ]
    return "".join(parts)


@st.composite
def timeline_labels(draw):
    lhs = draw(st.text(max_size=15))
    kind = draw(st.text(alphabet=string.ascii_letters + "0123456789_.>-(=", max_size=15))
    rest = draw(st.text(max_size=15))
    return draw(st.sampled_from([f"{lhs} = {kind}({rest}", f"{lhs}={kind}{rest}", kind + rest]))


LABELS = st.text(max_size=200) | recv_labels() | timeline_labels()


@FUZZ
@given(LABELS)
@example("[8B] [1.2.3Mb/s] e from /job:ps to /job:worker")  # was ValueError (float)
@example("[8B] [.Mb/s] e from /job:ps to /job:worker")  # was ValueError (float)
@example("[" + "1" * 5000 + "B] [1Mb/s] e from a to b")  # was ValueError (int digit limit)
def test_recv_label_is_parsed_or_none(label):
    attrs = parse_recv_label(label)
    if attrs is not None:
        assert isinstance(attrs[ATTR_BYTES], int) and attrs[ATTR_BYTES] >= 0
        assert isinstance(attrs[ATTR_RATE], float)


@FUZZ
@given(LABELS, st.text(max_size=60))
def test_op_type_is_always_a_nonempty_string(label, node_name):
    kind = op_type(label, node_name)
    assert isinstance(kind, str) and kind


_int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_odd_int = st.sampled_from([0, 1, -1, 2**63 - 1, -(2**63), 10**15]) | _int64
_names = st.sampled_from(["RecvTensor", "_SOURCE", "_SINK", "MatMul_1", ""]) | st.text(max_size=30)


@st.composite
def step_stats(draw):
    stats = step_stats_pb2.StepStats()
    for _ in range(draw(st.integers(0, 3))):
        dev = stats.dev_stats.add(device=draw(st.text(max_size=30)))
        for _ in range(draw(st.integers(0, 6))):
            node = dev.node_stats.add(
                node_name=draw(_names),
                timeline_label=draw(LABELS),
                all_start_micros=draw(_odd_int),
                op_end_rel_micros=draw(_odd_int),
                all_end_rel_micros=draw(_odd_int),
            )
            if draw(st.booleans()):
                node.all_start_nanos = draw(_odd_int)
                node.op_end_rel_nanos = draw(_odd_int)
                node.all_end_rel_nanos = draw(_odd_int)
    return stats


@FUZZ
@given(step_stats(), st.integers(-2, 5))
def test_step_stats_protos_give_records_and_never_raise(stats, limit):
    records = step_stats_records(stats, step=3)
    capped = step_stats_capped(stats, step=3, limit=limit)
    kept = len(records) if limit <= 0 else min(limit, len(records))
    assert len(capped) == (1 + kept if records else 0)
    for r in records:
        assert r.end_ns >= r.start_ns > 0
