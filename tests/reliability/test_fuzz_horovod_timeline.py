"""Fuzzed Horovod timeline parsing: arbitrary bytes, the real fixtures (tests/horovod/fixtures/,
written by horovodrun -np 2) cut and corrupted at random offsets and read while "growing", and
events of every JSON type in every field. The contract (tf_otel.sources.horovod_timeline):
truncated or corrupt parts are skipped and counted, never raised, in bounded time; and what
the parser hands on turns into Records without an exception (as tf_otel.instrument.horovod.timeline
does it, with integer ns).
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tf_otel.sources import horovod_timeline as tl

FIXTURES = Path(__file__).parent.parent / "horovod" / "fixtures"
TIMELINES = [
    (FIXTURES / n).read_bytes()
    for n in ("mpi_uncached.json", "gloo_cached_straggler.json", "gloo_cached_rank0_late.json")
]
FUZZ = settings(
    max_examples=200,
    deadline=3000,  # ms per example: generous for a loaded 2-core machine, still "bounded"
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def to_local(us: float) -> int:  # as tf_otel.instrument.horovod.timeline._emit converts
    return int(us * 1000)


def consume(events, world_size: int = 2) -> int:
    """Feed events, then build every rank's Records from what comes out; how many Records."""
    parser = tl.TimelineParser(max_open=8)
    for event in events:
        parser.feed(event)
    done = parser.take()
    tl.assign_fused_groups(done)
    n = 0
    for c in done:
        # read alone, and with rank 0 beginning its step after the negotiation started (the
        # ranks' step starts, as rank 0 has them) in a file opened just before
        start = c.negotiate_start if c.negotiate_start is not None else 0.0
        readings = (None, tl.negotiation(c, world_size, 3000.0, {0: start + 5000.0}, start - 1.0))
        for seen in readings:
            for rank in range(world_size):
                view = tl.rank_view(c, rank, world_size, negotiated=seen)
                if view is not None:
                    key = tl.collective_key("k", 1, c.tensor)
                    n += len(tl.records_for(c, view, 1, key, to_local))
        assert c.nbytes is None or c.nbytes >= 0
    return n


def read_in_chunks(path: Path, data: bytes, cuts) -> list:
    """Write ``data`` in pieces as a growing file, polling after each; the last poll is final."""
    reader = tl.TimelineReader(str(path))
    events = []
    path.write_bytes(b"")
    with open(path, "ab") as f:
        last = 0
        for cut in sorted(set(cuts)) + [len(data)]:
            f.write(data[last:cut])
            f.flush()
            last = max(last, cut)
            events.extend(reader.poll())
    events.extend(reader.poll(final=True))
    assert reader.garbage >= 0
    return events


@FUZZ
@given(st.binary(max_size=4000))
@example(b'{"a":' * 1100)  # deep nesting: was RecursionError out of poll()
@example(b'{"ph":[' * 1100 + b"1")
def test_arbitrary_bytes_never_raise(tmp_path, data):
    path = tmp_path / "timeline.json"
    path.write_bytes(data)
    reader = tl.TimelineReader(str(path))
    consume(reader.poll() + reader.poll(final=True))


@st.composite
def damaged_timelines(draw):
    data = draw(st.sampled_from(TIMELINES))
    end = draw(st.integers(0, len(data)))
    data = data[:end]
    for _ in range(draw(st.integers(0, 3))):  # overwrite a stretch with garbage
        at = draw(st.integers(0, len(data)))
        junk = draw(
            st.binary(max_size=20) | st.sampled_from([b"\x00", b"}", b'{"ph"', b"\xff\xfe"])
        )
        data = data[:at] + junk + data[at + len(junk) :]
    cuts = draw(st.lists(st.integers(0, len(data)), max_size=6))
    return data, cuts


@FUZZ
@given(damaged_timelines())
def test_truncated_and_corrupted_fixtures_read_while_growing_never_raise(tmp_path, damaged):
    data, cuts = damaged
    consume(read_in_chunks(tmp_path / "timeline.json", data, cuts))


_odd_numbers = st.sampled_from(
    [0, -1, 1, 2**63, -(2**63) - 1, 10**30, 1e300, -1e300, float("inf"), float("-inf"),
     float("nan"), 0.5, 1e-300]
) | st.integers() | st.floats()  # fmt: skip
_json_scalar = (
    st.none() | st.booleans() | _odd_numbers
    | st.text(max_size=10) | st.sampled_from(["12", "1e3", "x", "", "²", "1" * 5000])
)  # fmt: skip
_json = st.recursive(
    _json_scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_names = st.sampled_from(
    ["NEGOTIATE_ALLREDUCE", "ALLREDUCE", "NEGOTIATE_ALLGATHER", "BROADCAST",
     "MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE", "GLOO_ALLREDUCE", "NCCL_ALLREDUCE",
     "0", "1", "7", "process_name", "X"]
)  # fmt: skip
_args = st.fixed_dictionaries(
    {},
    optional={
        "start_time_since_epoch_in_micros": _odd_numbers | _json_scalar,
        "name": _json,
        "dtype": st.sampled_from(["float32", "int64", "bool", "x"]) | _json,
        "shape": st.sampled_from(["[2, 3]", "[-1]", "()", "[1e3]", "[" + "9" * 30 + "]"]) | _json,
    },
)
_event = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.sampled_from(["M", "B", "E", "X", "i"]) | _json,
        "pid": st.integers(-2, 3) | _odd_numbers | _json,
        "ts": st.integers(0, 10**7) | _odd_numbers | _json,
        "name": _names | _json,
        "args": _args | _json,
    },
)
_metadata = st.fixed_dictionaries(
    {"ph": st.just("M"), "pid": st.just(0), "name": st.just("process_name"),
     "args": st.fixed_dictionaries({"start_time_since_epoch_in_micros": _odd_numbers})}
)  # fmt: skip


@settings(FUZZ, max_examples=150)
@given(st.lists(_metadata | _event | _json, max_size=40))
@example([{"ph": "M", "args": {"start_time_since_epoch_in_micros": 0}},
          {"ph": "B", "name": "ALLREDUCE", "pid": float("inf"), "ts": 1}])  # fmt: skip
@example([{"ph": "M", "args": {"start_time_since_epoch_in_micros": float("inf")}},
          {"ph": "B", "name": "ALLREDUCE", "pid": 1, "ts": 1},
          {"ph": "E", "pid": 1, "ts": 2}])  # fmt: skip
@example([{"ph": "M", "args": {"start_time_since_epoch_in_micros": 0}},
          {"ph": "B", "name": "ALLREDUCE", "pid": 1, "ts": float("nan")},
          {"ph": "E", "pid": 1, "ts": 2}])  # fmt: skip
def test_events_with_wrong_types_are_skipped_never_raised(tmp_path, events):
    consume(events)  # straight into the parser
    # and through the file reader (json writes NaN / Infinity, which Python's json reads back)
    path = tmp_path / "timeline.json"
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events))
    consume(read_in_chunks(path, path.read_bytes(), []))
