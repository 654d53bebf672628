"""tf.data stage arithmetic (sources/tf_data.py) on a hand-made XSpace: self time is busy time
minus the nested input stages' GetNext on the same thread; asynchronous stages report waiting,
not own time; the stage count is capped (the busiest kept)."""

from __future__ import annotations

from tf_otel.sources.tf_data import stage_kind, stage_records
from tf_otel.sources.xplane import parse_xspace

US = 1_000_000  # ps


def _space(events_by_line):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    ids = {}
    for line_id, events in enumerate(events_by_line):
        line = plane.lines.add(id=line_id, timestamp_ns=1_000_000)
        for name, start_us, end_us in events:
            if name not in ids:
                ids[name] = len(ids) + 1
                plane.event_metadata[ids[name]].id = ids[name]
                plane.event_metadata[ids[name]].name = name
            line.events.add(
                metadata_id=ids[name], offset_ps=start_us * US, duration_ps=(end_us - start_us) * US
            )
    return parse_xspace(space.SerializeToString())


ROOT = "Iterator::Root"
PREFETCH = ROOT + "::Prefetch"
MAP = PREFETCH + "::Map"
READER = MAP + "::ForeverRepeat[0]::TFRecord"


def test_self_time_excludes_nested_inputs_and_async_stages_wait():
    space = _space(
        [
            [(ROOT, 0, 100), (PREFETCH, 5, 95), ("IteratorGetNextOp::DoCompute", 0, 100)],
            [(MAP, 0, 50), (READER, 10, 20), (MAP, 60, 90), (READER, 65, 70)],
        ]
    )
    records = stage_records(space, step=3, base_ns=0, parent_id=77)
    by_kind = {r.attributes["tensorflow.data.stage"]: r for r in records}
    assert set(by_kind) == {"Root", "Prefetch", "Map", "TFRecord"}
    assert all(r.parent_id == 77 and r.step == 3 and r.category == "input" for r in records)
    mapped = by_kind["Map"].attributes
    assert (mapped["tf_otel.tf_data.events"], mapped["tf_otel.tf_data.busy_ns"]) == (2, 80_000)
    assert mapped["tf_otel.tf_data.self_ns"] == 80_000 - 15_000
    assert by_kind["TFRecord"].attributes["tf_otel.tf_data.self_ns"] == 15_000
    assert by_kind["Root"].attributes["tf_otel.tf_data.self_ns"] == 10_000
    prefetch = by_kind["Prefetch"].attributes
    assert prefetch["tf_otel.tf_data.async"] is True
    assert (prefetch["tf_otel.tf_data.self_ns"], prefetch["tf_otel.tf_data.wait_ns"]) == (0, 90_000)
    assert by_kind["Map"].start_ns == 1_000_000 and by_kind["Map"].end_ns == 1_090_000
    assert by_kind["Map"].attributes["tensorflow.data.stage.path"] == MAP


def test_stage_count_is_capped_and_no_iterator_means_nothing():
    space = _space([[(f"Iterator::Root::S{i}", i, i + 1 + i) for i in range(40)]])
    records = stage_records(space, base_ns=0, limit=32)
    assert len(records) == 32
    # no input span to hang them under: framework spans of the step, not input time
    assert {r.category for r in records} == {"framework"} and records[0].parent_id is None
    assert {r.attributes["tensorflow.data.stage"] for r in records} == {
        f"S{i}" for i in range(8, 40)
    }  # the busiest kept
    assert stage_records(_space([[("Sum:Sum", 0, 5)]]), base_ns=0) == []
    assert stage_kind("Iterator::Root::Repeat[0]::FlatMap[1]::TFRecord") == "TFRecord"
    assert stage_kind("Iterator::Root::ForeverRepeat[0]") == "ForeverRepeat"
