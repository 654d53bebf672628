"""sources.horovod_stamp_records (pure): last arrivals over ranks, per-rank records, and the
detail-step policy (no TF, no Horovod)."""

from __future__ import annotations

import dataclasses

from tf_otel import record
from tf_otel.instrument.horovod.collective_source import detail_wanted
from tf_otel.instrument.horovod.stamps import parts_wanted
from tf_otel.otel.ids import step_trace_id
from tf_otel.sources import horovod_stamp_records as hs

STAMP = hs.Stamp("grad_w0", "allreduce", "float32", "[32, 32]", 4096)


def test_last_arrival_is_the_latest_rank_per_tensor():
    last = hs.last_arrivals({0: {"a": 100, "b": 500}, 1: {"a": 300, "b": 200}, 2: {"a": 250}})
    assert last == {"a": (300, 1), "b": (500, 0)}


def test_a_waiting_rank_gets_wait_and_transfer_children():
    out = hs.records_for(
        STAMP, 1_000, 9_000, 4_000, 2, rank=0, step=7, key="k/7/grad_w0", min_child_wait_ns=1
    )
    parent, wait, transfer = out
    assert parent.category == record.COLLECTIVE and (parent.start_ns, parent.end_ns) == (
        1_000,
        9_000,
    )
    assert parent.attributes["horovod.wait_ns"] == 3_000
    assert parent.attributes["horovod.last_arrival"] is False
    assert parent.attributes["horovod.arrival"] == "stamp"
    assert parent.attributes["horovod.bytes"] == 4096
    assert (wait.start_ns, wait.end_ns, wait.parent_id) == (1_000, 4_000, parent.record_id)
    assert (transfer.start_ns, transfer.end_ns) == (4_000, 9_000)


def test_the_last_rank_and_short_waits_have_no_children():
    out = hs.records_for(STAMP, 4_000, 9_000, 4_000, 1, rank=1, step=7, key="k")
    assert [r.category for r in out] == [record.COLLECTIVE]
    short = hs.records_for(STAMP, 1_000, 9_000_000, 900_000, 2, rank=0, step=7, key="k")
    assert [r.category for r in short] == [record.COLLECTIVE]
    assert short[0].attributes["horovod.wait_ns"] == 899_000  # still on the collective span
    assert out[0].attributes["horovod.last_arrival"] is True
    assert out[0].attributes["horovod.wait_ns"] == 0


def test_children_stay_inside_the_collective_whatever_the_clocks_say():
    # last arrival (mapped to this rank's clock) after this rank's end, or before its arrival
    late = hs.records_for(STAMP, 1_000, 5_000, 8_000, 1, 0, 1, "k", min_child_wait_ns=1)
    early = hs.records_for(STAMP, 1_000, 5_000, 500, 1, 0, 1, "k", min_child_wait_ns=1)
    for out in (late, early):
        parent = out[0]
        for child in out[1:]:
            assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns


def test_unknown_last_arrival_says_so():
    out = hs.records_for(STAMP, 1_000, 5_000, None, None, rank=3, step=1, key="k")
    assert out[0].attributes["horovod.arrival"] == "unknown"
    assert out[0].attributes["horovod.last_arrival"] is False
    assert [r.category for r in out] == [record.COLLECTIVE]


def test_nbytes_needs_a_known_dtype_and_static_shape():
    assert hs.nbytes("float32", [3, 4]) == 48
    assert hs.nbytes("float32", [None, 4]) is None
    assert hs.nbytes("string", [3]) is None


def test_detail_policy_same_for_every_rank_and_about_one_in_n():
    ids = [step_trace_id("job-1", "keras_train", step) for step in range(5000)]
    picked = [detail_wanted(t, 10) for t in ids]
    assert picked == [detail_wanted(t, 10) for t in ids]  # a function of the trace id only
    assert 400 <= sum(picked) <= 600
    assert all(detail_wanted(t, 1) for t in ids[:50])
    assert not any(detail_wanted(t, 0) for t in ids[:50])
    # independent of the ratio sampler (low 64 bits): sampled steps are picked at the same rate
    sampled = [t for t in ids if (t & (2**64 - 1)) < 2**63]
    assert 0.07 <= sum(detail_wanted(t, 10) for t in sampled) / len(sampled) <= 0.13


def test_no_children_when_parts_are_off_the_wait_stays_on_the_span():
    out = hs.records_for(STAMP, 1_000, 9_000_000, 5_000_000, 1, 0, 1, "k", min_child_wait_ns=None)
    assert [r.category for r in out] == [record.COLLECTIVE]
    assert out[0].attributes["horovod.wait_ns"] == 4_999_000


def test_parts_by_default_only_where_detail_is_sparse():
    assert parts_wanted(None, 100) and parts_wanted(None, 10)
    assert not parts_wanted(None, 1) and not parts_wanted(None, 9)
    assert parts_wanted(True, 1) and not parts_wanted(False, 100)


def test_tensors_that_completed_together_form_one_group_per_response():
    us = 1_000
    ends = {
        "g0": ("allreduce", "float32", 10_000 * us),
        "g1": ("allreduce", "float32", 10_000 * us + 20 * us),  # same response as g0
        "g2": ("allreduce", "float32", 10_000 * us + 60 * us),  # chained within the gap
        "g3": ("allreduce", "float32", 12_000 * us),  # the next response, 2 ms later
        "g4": ("allreduce", "float32", 12_000 * us + 10 * us),
        "h0": ("allreduce", "float16", 12_000 * us + 30 * us),  # another dtype: not fused
        "b0": ("broadcast", "float32", 20_000 * us),  # alone: no group
    }
    assert hs.completed_together(ends) == [["g0", "g1", "g2"], ["g3", "g4"]]
    assert hs.completed_together(ends, gap_ns=10 * us) == [["g3", "g4"]]
    assert hs.completed_together({}) == []


def test_a_group_arrives_with_its_last_member_and_waits_for_the_latest_rank():
    a = hs.Stamp("g0", "allreduce", "float32", "[4]", 16)
    b = hs.Stamp("g1", "allreduce", "float32", "[8]", 32)
    stamp, arrival, end, last = hs.fused(
        [(a, 1_000, 9_000), (b, 3_000, 9_100)], [(5_000, 2), (7_000, 1)]
    )
    assert (stamp.tensor, stamp.nbytes, stamp.op, stamp.dtype) == ("g0", 48, "allreduce", "float32")
    assert (arrival, end, last) == (3_000, 9_100, (7_000, 1))
    unknown = hs.fused([(a, 1_000, 9_000), (b, 3_000, 9_100)], [(5_000, 2), None])
    assert unknown[3] is None, "one member's last arrival unknown: the group's is unknown"
    no_size = hs.fused([(a, 1, 2), (hs.Stamp("g2", "allreduce"), 1, 2)], [None, None])
    assert no_size[0].nbytes is None


def test_fused_spans_only_where_detail_is_dense_unless_set():
    from tf_otel.instrument.horovod.stamps import fused_wanted

    assert fused_wanted(None, 1) and fused_wanted(None, 9)
    assert not fused_wanted(None, 10) and not fused_wanted(None, 20) and not fused_wanted(None, 0)
    assert fused_wanted(True, 20) and not fused_wanted(False, 1)


def test_the_kth_collective_of_each_device_is_one_collective_of_its_replicas():
    from tf_otel.instrument.horovod.replicas import ReplicaNames

    names = ReplicaNames()

    class Graph:  # any object that can be weakly referenced
        pass

    graph, other = Graph(), Graph()
    assert names.name_for(graph, "/cpu:0", "CollectiveReduceV2") == ("CollectiveReduceV2", 0)
    assert names.name_for(graph, "/cpu:0", "CollectiveReduceV2_1") == ("CollectiveReduceV2_1", 0)
    # the second device's ops, built after the first's, in the same order
    assert names.name_for(graph, "/cpu:1", "replica_1/CollectiveReduceV2") == (
        "CollectiveReduceV2",
        1,
    )
    assert names.name_for(graph, "/cpu:1", "replica_1/CollectiveReduceV2_1") == (
        "CollectiveReduceV2_1",
        1,
    )
    assert names.name_for(other, "/cpu:1", "X") == ("X", 0)  # each graph its own order


def test_replicas_of_one_collective_merge_into_the_process_own():
    stamp = hs.Stamp("CollectiveReduceV2", "allreduce", "float32", "[8]", 32, library="tensorflow")
    replica = [dataclasses.replace(stamp, replica=r) for r in range(3)]
    alone = hs.Stamp("grad", "allreduce")
    single = hs.Stamp("Other", "allreduce", replica=0)
    found = [
        (replica[0], 1_000, 9_000, None),
        (replica[1], 7_000, 9_500, None),
        (replica[2], 2_000, 9_100, None),
        (alone, 500, 600, None),
        (single, 100, 200, None),
    ]
    merged, spreads = hs.merge_replicas(found)
    by_name = {entry[0].tensor: entry for entry in merged}
    assert sorted(by_name) == ["CollectiveReduceV2", "Other", "grad"]
    # the process arrives with its last replica and ends with its last result
    assert by_name["CollectiveReduceV2"][1:3] == (7_000, 9_500)
    assert by_name["CollectiveReduceV2"][0].replica is None
    assert spreads == {"CollectiveReduceV2": hs.ReplicaSpread(3, 1, 6_000)}
    assert by_name["grad"] == (alone, 500, 600, None)
    out = hs.records_for(
        by_name["CollectiveReduceV2"][0],
        7_000,
        9_500,
        7_000,
        0,
        rank=0,
        step=3,
        key="k",
        spread=spreads["CollectiveReduceV2"],
    )
    attributes = out[0].attributes
    assert (
        attributes[record.ATTR_REPLICAS],
        attributes[record.ATTR_REPLICA_LAST],
        attributes[record.ATTR_REPLICA_SPREAD_NS],
    ) == (3, 1, 6_000)
    assert (
        record.ATTR_REPLICAS not in hs.records_for(alone, 500, 600, 500, 0, 0, 3, "k")[0].attributes
    )


def test_namesakes_of_one_device_are_not_merged():
    stamp = hs.Stamp("CollectiveReduceV2", "allreduce", replica=0)
    found = [(stamp, 1_000, 2_000, None), (stamp, 5_000, 6_000, None)]
    merged, spreads = hs.merge_replicas(found)
    assert spreads == {}
    assert [(m[0].replica, m[1]) for m in merged] == [(None, 1_000), (None, 5_000)]
