"""Horovod timeline parser on real timelines written by horovodrun -np 2 (fixtures/): complete,
read incrementally, truncated at every kind of cut, and with garbage inside."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tf_otel import record
from tf_otel.sources import horovod_timeline as tl

FIXTURES = Path(__file__).parent / "fixtures"
STEPS = json.loads((FIXTURES / "steps.json").read_text())


def parse_file(path: Path, final: bool = True):
    reader = tl.TimelineReader(str(path))
    parser = tl.TimelineParser()
    for event in reader.poll(final=final):
        parser.feed(event)
    done = parser.take()
    tl.assign_fused_groups(done)
    return done, reader


def step_of(c: tl.Collective, fixture: str) -> int:
    """The step whose rank-0 window holds the collective's end (as the hook matches them)."""
    for step, (lo, hi) in STEPS[fixture].items():
        if lo <= c.op_end <= hi:
            return int(step)
    raise AssertionError(f"{c.tensor} ends outside every step window")


def test_uncached_mpi_timeline_has_ticks_bytes_and_the_straggler():
    done, reader = parse_file(FIXTURES / "mpi_uncached.json")
    assert reader.garbage == 0
    assert len(done) == 12  # 2 gradients x 6 steps
    by_step = {}
    for c in done:
        by_step.setdefault(step_of(c, "mpi_uncached.json"), []).append(c)
    assert sorted(by_step) == [0, 1, 2, 3, 4, 5]
    for c in done:
        assert c.op == "allreduce" and c.backend == "mpi"
        assert "HorovodAllreduce" in c.tensor and c.dtype == "float32"
        assert c.nbytes == {"[32, 64]": 32 * 64 * 4, "[64, 1]": 64 * 4}[c.shape]
        assert sorted(c.ticks) == [0, 1]
        assert c.op_start <= c.transfer_start <= c.transfer_end <= c.op_end
        assert c.fused_group is not None
    for c in by_step[4]:  # rank 1 slept 50 ms before its gradients
        assert tl.last_rank(c, 2, 3000) == 1
        v0, v1 = tl.rank_view(c, 0, 2), tl.rank_view(c, 1, 2)
        assert v0.how == v1.how == "tick"
        assert v1.last_arrival and not v0.last_arrival
        assert 40_000 <= v0.last_ready - v0.arrival <= 70_000  # us
        assert v1.last_ready - v1.arrival == 0
    # both tensors of a step were fused into one transfer
    for members in by_step.values():
        assert len({c.fused_group for c in members}) == 1
    assert len({c.fused_group for c in done}) == 6


def test_cached_gloo_timeline_infers_the_last_rank_from_rank0_waiting():
    done, _ = parse_file(FIXTURES / "gloo_cached_straggler.json")
    assert len(done) == 2
    for c in done:
        assert not c.ticks, "response-cache hits carry no per-rank ticks"
        assert c.backend == "gloo"
        v0, v1 = tl.rank_view(c, 0, 2), tl.rank_view(c, 1, 2)
        assert v0.how == "negotiate" and v1.how == "inferred"
        assert v1.last_arrival and not v0.last_arrival
        assert 40_000 <= v0.last_ready - v0.arrival <= 70_000
        # with more ranks the timeline cannot say who was last
        assert tl.last_rank(c, 4, 3000) is None
        assert tl.rank_view(c, 2, 4).how == "unknown"


def test_incremental_reading_in_random_chunks_equals_one_shot(tmp_path):
    source = (FIXTURES / "mpi_uncached.json").read_bytes()
    whole, _ = parse_file(FIXTURES / "mpi_uncached.json")
    path = tmp_path / "live.json"
    path.write_bytes(b"")
    reader, parser = tl.TimelineReader(str(path)), tl.TimelineParser()
    rng = random.Random(4)
    pos, done = 0, []
    while pos < len(source):
        cut = min(len(source), pos + rng.randint(1, 400))
        with open(path, "ab") as f:
            f.write(source[pos:cut])
        pos = cut
        for event in reader.poll():
            parser.feed(event)
        done.extend(parser.take())
    for event in reader.poll(final=True):
        parser.feed(event)
    done.extend(parser.take())
    assert reader.garbage == 0
    assert [(c.tensor, c.op_end, c.ticks) for c in done] == [
        (c.tensor, c.op_end, c.ticks) for c in whole
    ]


@pytest.mark.parametrize("fraction", [0.1, 0.33, 0.5, 0.77, 0.95])
def test_truncated_timeline_keeps_every_finished_collective(tmp_path, fraction):
    source = (FIXTURES / "mpi_uncached.json").read_text()
    cut = int(len(source) * fraction)
    path = tmp_path / "crashed.json"
    path.write_text(source[:cut])  # a crashed job: no closing bracket, maybe half an event
    done, _ = parse_file(path)
    whole, _ = parse_file(FIXTURES / "mpi_uncached.json")
    # the collectives whose final E is fully inside the prefix
    prefix = source[:cut]
    finished = [c for c in whole if f'"ts": {int(c.op_end - _epoch(source))}, ' in prefix]
    assert [c.op_end for c in done] == [c.op_end for c in finished]


def _epoch(text: str) -> float:
    start = text.index("start_time_since_epoch_in_micros") + len("start_time_since_epoch_in_micros")
    return float(text[start:].split(":", 1)[1].split("}", 1)[0])


def test_garbage_inside_is_skipped_and_counted(tmp_path):
    source = (FIXTURES / "mpi_uncached.json").read_text()
    middle = source.index('{"ph": "B", "name": "NEGOTIATE_ALLREDUCE"', len(source) // 2)
    path = tmp_path / "corrupt.json"
    path.write_text(source[:middle] + "\x00\x00#garbage{{{not json" + source[middle:])
    done, reader = parse_file(path)
    whole, _ = parse_file(FIXTURES / "mpi_uncached.json")
    assert reader.garbage >= 1
    assert [c.op_end for c in done] == [c.op_end for c in whole]


@pytest.mark.parametrize("content", [b"", b"[", b"\x00\xff\xfe garbage", b'[{}, 3, {"ph": 7}]'])
def test_hopeless_files_give_nothing_and_never_raise(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    done, _ = parse_file(path)
    assert done == []


def test_missing_file_gives_nothing(tmp_path):
    assert tl.TimelineReader(str(tmp_path / "none.json")).poll(final=True) == []


def test_records_for_a_rank_are_a_collective_with_wait_and_transfer_children():
    done, _ = parse_file(FIXTURES / "mpi_uncached.json")
    c = next(c for c in done if step_of(c, "mpi_uncached.json") == 4)
    view = tl.rank_view(c, 0, 2)
    records = tl.records_for(c, view, 4, "k/4/t", lambda us: int(us * 1000), "k/4/")
    parent, wait, transfer = records
    assert parent.category == record.COLLECTIVE
    assert wait.category == record.COLLECTIVE_WAIT and wait.parent_id == parent.record_id
    assert transfer.category == record.COLLECTIVE_TRANSFER
    assert transfer.parent_id == parent.record_id
    assert parent.start_ns == wait.start_ns and wait.end_ns <= transfer.start_ns
    assert transfer.end_ns == parent.end_ns
    assert parent.attributes["horovod.wait_ns"] == wait.end_ns - wait.start_ns > 40_000_000
    assert parent.attributes["horovod.bytes"] == c.nbytes
    assert parent.attributes["horovod.backend"] == "mpi"
    assert parent.attributes["horovod.last_arrival"] is False
    assert parent.attributes["tf_otel.collective.key"] == "k/4/t"
