"""Horovod timeline parser on real timelines written by horovodrun -np 2 (fixtures/): complete,
read incrementally, truncated at every kind of cut, with garbage inside, and split in two files
where rank 0 switched files between steps."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from tf_otel import record
from tf_otel.instrument.horovod import timeline
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


LATE0 = "gloo_cached_rank0_late.json"  # rank 0 slept 80 ms in Python before step 5


def began(fixture: str, step: int) -> dict:
    """Each rank's start of ``step`` (us, rank 0's clock) in the run that wrote ``fixture``."""
    return {0: STEPS[fixture][str(step)][0], 1: STEPS[f"{fixture}:rank 1"][str(step)][0]}


def by_step(fixture: str) -> dict:
    done, reader = parse_file(FIXTURES / fixture)
    assert reader.garbage == 0
    found: dict = {}
    for c in done:
        found.setdefault(step_of(c, fixture), []).append(c)
    return found


def test_a_cache_hit_alone_does_not_say_which_rank_was_late():
    """Horovod starts a cache hit's NEGOTIATE when ANY rank's request is queued, so the events are
    the same whichever rank was late: rank 1 late inside step 4 (examples/horovod_tape.py) and
    rank 0 late before step 5 both show a ~50-80 ms NEGOTIATE and no ticks. Without the ranks'
    step starts nobody is named and nobody waits (it read rank 1 last and rank 0 waiting in both,
    wrong for the second)."""
    late1, _ = parse_file(FIXTURES / "gloo_cached_straggler.json")
    late0 = by_step(LATE0)[5]
    assert len(late1) == 2 and len(late0) == 3
    for c in late1 + late0:
        assert not c.ticks, "response-cache hits carry no per-rank ticks"
        assert c.backend == "gloo"
        assert 40_000 <= c.negotiate_end - c.negotiate_start <= 90_000
        views = [tl.rank_view(c, r, 2) for r in (0, 1)]
        assert [v.how for v in views] == ["unknown", "unknown"]
        assert not any(v.last_arrival for v in views)
        assert tl.last_rank(c, 2, 3000) is None
        for v in views:
            record = tl.records_for(c, v, 5, "k/5/t", lambda us: int(us * 1000))[0]
            assert record.attributes["horovod.wait_ns"] == 0
            assert record.attributes["horovod.last_arrival"] is False


def test_rank0_that_began_after_the_negotiation_started_is_the_last_and_rank1_waited():
    """The recorded fragment of a real job: rank 0 began step 5 80 ms after rank 1, whose
    request started the negotiation; rank 0 is named last, rank 1 waited ~80 ms."""
    steps = by_step(LATE0)
    assert sorted(steps) == [4, 5, 6] and all(len(cs) == 3 for cs in steps.values())
    starts = began(LATE0, 5)
    for c in steps[5]:
        assert starts[1] < c.negotiate_start < starts[0]  # rank 1's request, rank 0 not begun
        seen = tl.negotiation(c, 2, 3000, starts)
        assert (seen.first, seen.last) == (1, 0)
        v0, v1 = (tl.rank_view(c, r, 2, negotiated=seen) for r in (0, 1))
        assert (v0.how, v1.how) == ("inferred", "negotiate")
        assert v0.last_arrival and not v1.last_arrival
        assert v0.last_ready - v0.arrival == 0
        assert 70_000 <= v1.last_ready - v1.arrival <= 90_000  # us
        r0 = tl.records_for(c, v0, 5, "k/5/t", lambda us: int(us * 1000))
        r1 = tl.records_for(c, v1, 5, "k/5/t", lambda us: int(us * 1000))
        assert [r.category for r in r0] == [record.COLLECTIVE, record.COLLECTIVE_TRANSFER]
        assert r0[0].attributes["horovod.wait_ns"] == 0
        assert r0[0].attributes["horovod.last_arrival"] is True
        assert r1[1].category == record.COLLECTIVE_WAIT
        assert r1[0].attributes["horovod.wait_ns"] >= 70_000_000
        assert r1[0].attributes["horovod.last_arrival"] is False


def test_the_same_events_with_rank1_beginning_late_name_rank1():
    """A late rank 1 writes these very events (NEGOTIATE carries no rank): with the step starts
    swapped, rank 1 is named last and rank 0 waited."""
    starts = began(LATE0, 5)
    swapped = {0: starts[1], 1: starts[0]}
    for c in by_step(LATE0)[5]:
        seen = tl.negotiation(c, 2, 3000, swapped)
        assert (seen.first, seen.last) == (0, 1)
        v0, v1 = (tl.rank_view(c, r, 2, negotiated=seen) for r in (0, 1))
        assert v1.last_arrival and not v0.last_arrival
        assert (v0.how, v1.how) == ("negotiate", "inferred")
        assert 70_000 <= v0.last_ready - v0.arrival <= 90_000


def test_steps_with_nothing_injected_name_nobody():
    """Steps 4 and 6 of the same job: both ranks began before the negotiation started and it
    lasted under 3 ms: every rank read at its end, no wait, nobody last. Where the file opened
    just before the negotiation started, it may have started with the file (Horovod writes
    nothing while no file is open): the spread is not known, nothing is claimed."""
    steps = by_step(LATE0)
    for step in (4, 6):
        starts = began(LATE0, step)
        for c in steps[step]:
            assert max(starts.values()) < c.negotiate_start
            assert c.negotiate_end - c.negotiate_start <= 3000
            seen = tl.negotiation(c, 2, 3000, starts, opened=c.negotiate_start - 50_000)
            assert seen == tl.Negotiation(together=True)
            views = [tl.rank_view(c, r, 2, negotiated=seen) for r in (0, 1)]
            assert [v.how for v in views] == ["negotiate", "negotiate"]
            assert not any(v.last_arrival for v in views)
            assert all(v.arrival == v.last_ready for v in views)
            opened_then = tl.negotiation(c, 2, 3000, starts, opened=c.negotiate_start - 500)
            assert opened_then == tl.Negotiation()
            assert tl.rank_view(c, 0, 2, negotiated=opened_then).how == "unknown"


def test_more_ranks_and_inconsistent_starts():
    c = by_step(LATE0)[5][0]
    b = c.negotiate_start
    # 3 ranks: the two that began after the start make the third the first; the last unknown
    seen = tl.negotiation(c, 3, 3000, {0: b + 80_000, 1: b - 10, 2: b + 5000})
    assert (seen.first, seen.last, seen.together) == (1, None, False)
    views = [tl.rank_view(c, r, 3, negotiated=seen) for r in range(3)]
    assert [v.how for v in views] == ["unknown", "negotiate", "unknown"]
    assert not any(v.last_arrival for v in views)
    # only one of three known to be later: no one named
    assert tl.negotiation(c, 3, 3000, {0: b + 80_000}) == tl.Negotiation()
    # every rank "began after" the start: clocks or matching are off, nothing is claimed
    assert tl.negotiation(c, 2, 3000, {0: b + 80_000, 1: b + 80_000}) == tl.Negotiation()
    # within the clocks' slack of the start: not evidence
    assert tl.negotiation(c, 2, 3000, {0: b + 1000, 1: b - 1000}).first is None


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


def _switched_files(events: list, cut: int) -> tuple:
    """``events`` written to two files as Horovod's writer does when ``start_timeline`` names a
    new file while one runs: the first file closed after ``cut`` events; the second begins with
    the epoch record, and its tensors are numbered anew (the writer clears its table), each
    named by a ``process_name`` record before its first event."""
    names = {e["pid"]: e["args"]["name"] for e in events[:cut] if "name" in e.get("args", {})}
    second = [e for e in events[:4] if e["pid"] == 0]  # the epoch and its sort index
    renumbered: dict = {}
    for event in events[cut:]:
        if event["ph"] == "M":
            if "name" in event.get("args", {}):
                names[event["pid"]] = event["args"]["name"]
            continue
        pid = event["pid"]
        if pid not in renumbered:
            renumbered[pid] = len(renumbered) + 1
            meta = {"name": "process_name", "ph": "M", "pid": renumbered[pid]}
            second.append({**meta, "args": {"name": names[pid]}})
        second.append({**event, "pid": renumbered[pid]})
    return events[:cut], second


def _cuts_inside_negotiations(events: list) -> list:
    """Every event index inside a negotiation: after its first rank's tick, before its end."""
    open_pids: dict = {}
    cuts = []
    for at, event in enumerate(events):
        if event["ph"] == "B" and event["name"].startswith("NEGOTIATE_"):
            open_pids[event["pid"]] = 0
        elif event["ph"] == "X" and event["pid"] in open_pids:
            open_pids[event["pid"]] += 1
            if open_pids[event["pid"]] == 1:
                cuts.append(at + 1)
        elif event["ph"] == "E" and event["pid"] in open_pids:
            del open_pids[event["pid"]]
    return cuts


def _write_switched(directory: Path, events: list, cut: int) -> tuple:
    paths = directory / f"a{cut}.json", directory / f"b{cut}.json"
    for path, part in zip(paths, _switched_files(events, cut)):
        path.write_text("[\n" + ",\n".join(json.dumps(e) for e in part) + "]")
    return paths


def _parsed(path: Path, parser: tl.TimelineParser) -> list:
    for event in tl.TimelineReader(str(path)).poll(final=True):
        parser.feed(event)
    return parser.take()


def test_a_negotiation_cut_by_a_file_switch_is_read_whole(tmp_path):
    """Rank 0 switches timeline files from one detail step to the next without a stop, so a
    rank's request already queued for the next step is written to the old file and the rest of
    that negotiation to the new one: the new file's parser continues the old one's collectives
    (tensor numbers differ between files) and reads the same collectives as the one file."""
    events = json.loads((FIXTURES / "mpi_uncached.json").read_text())
    whole, _ = parse_file(FIXTURES / "mpi_uncached.json")
    cuts = _cuts_inside_negotiations(events)
    assert len(cuts) >= 6
    for cut in cuts:
        paths = _write_switched(tmp_path, events, cut)
        parser = tl.TimelineParser()
        done = _parsed(paths[0], parser)
        following = tl.TimelineParser()
        following.continue_from(parser)
        done += _parsed(paths[1], following)
        assert [(c.tensor, c.negotiate_start, c.ticks, c.op_end) for c in done] == [
            (c.tensor, c.negotiate_start, c.ticks, c.op_end) for c in whole
        ], cut
        # control: the second file read on its own loses the cut negotiation's first ready tick
        alone = _parsed(paths[1], tl.TimelineParser())
        assert any(len(c.ticks) < 2 for c in alone), cut


def test_the_hook_reads_a_switched_file_after_the_one_before_it(tmp_path, monkeypatch):
    """Rank 0's reader thread: a file switched to is not read before the file before it is
    read to its end (listed first or not), and then continues its collectives."""
    events = json.loads((FIXTURES / "mpi_uncached.json").read_text())
    whole, _ = parse_file(FIXTURES / "mpi_uncached.json")
    cut = _cuts_inside_negotiations(events)[2]
    first, second = (
        timeline._Source(str(p), managed=True) for p in _write_switched(tmp_path, events, cut)
    )
    second.after = first
    first.stopped_at = second.stopped_at = time.monotonic() - 2 * timeline._CLOSE_WAIT_S
    hook = timeline.TimelineHook()
    hook._sources = [second, first]
    hook._windows[("k", 0)] = timeline._Window(start=0, end=2**62, source=second)
    emitted: list = []
    monkeypatch.setattr(hook, "_emit", lambda key, step, window, *rest: emitted.append(window))
    hook.process(final=False)
    assert second.reader.offset == 0 and first.done, "the file before it is read first"
    assert emitted == [], "the step's own file is not read yet"
    hook.process(final=False)
    assert second.done and len(emitted) == 1
    assert [(c.tensor, c.negotiate_start, c.ticks) for c in emitted[0].items] == [
        (c.tensor, c.negotiate_start, c.ticks) for c in whole
    ]
