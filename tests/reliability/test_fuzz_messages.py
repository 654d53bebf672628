"""Property-based tests of the cross-rank messages: arbitrary bytes, lines and JSON sent to a live
coordinator and a live clock service, by strangers and by ranks that hold the job key, and fed to
the message decoders. Only counted refusals / bad messages: no exception escapes a server thread,
no connection hangs, and a good rank is still served afterwards. Malformed bodies of every known
message type are rejected by ``messages.decode`` (``BadMessage`` naming the field), so they never
reach a handler; what decode accepts, the real handlers take without raising."""

from __future__ import annotations

import json
import socket
import struct
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tf_otel.clock import transport
from tf_otel.cluster import coordinator, coordinator_client, messages
from tf_otel.health import counters
from tf_otel.instrument.horovod import timeline
from tf_otel.instrument.ops import hook as ops_hook
from tf_otel.job import job_secret
from tf_otel.sources import horovod_timeline as tl

from .channel_peers import clock_login, coordinator_login, send_and_drain, wait_until

FUZZ = settings(
    max_examples=60,
    deadline=None,  # real sockets on a shared machine; hangs are caught by HANG_GUARD_S
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
message_types = st.sampled_from(
    ["extent", "hello", "bye", "challenge", "welcome", "hvd.c", "hvd.done", "ops.w", "zz"]
)
objects = st.fixed_dictionaries(
    {"t": message_types},
    optional={
        "k": json_values,
        "s": json_values,
        "a": json_values,
        "b": json_values,
        "rank": json_values,
        "mac": json_values,
        "cn": json_values,
        "c": json_values,
    },
) | st.dictionaries(st.text(max_size=4), json_values, max_size=5)
lines = st.one_of(
    st.binary(max_size=300),
    objects.map(lambda o: json.dumps(o).encode() + b"\n"),
    st.lists(objects.map(json.dumps), max_size=6).map(lambda ls: "\n".join(ls).encode() + b"\n"),
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n + b"\n"),  # nesting past the stack
)


class Errors:
    """Exceptions that escape any thread (a server's connection thread included)."""

    def __init__(self) -> None:
        self.seen: list = []
        self._previous = threading.excepthook

    def __enter__(self) -> Errors:
        threading.excepthook = lambda args: self.seen.append(args.exc_value)
        return self

    def __exit__(self, *exc: object) -> None:
        threading.excepthook = self._previous


@pytest.fixture(scope="module")
def live_coordinator():
    roots: list = []
    aggregator = coordinator.StepAggregator(3, 0.2, lambda *args: roots.append(args))
    assert aggregator.serve(("127.0.0.1", 0))
    address = aggregator.address  # the port the OS gave
    with Errors() as errors:
        yield aggregator, address, roots, errors
    aggregator.close()


@pytest.fixture(scope="module")
def live_clock():
    server = transport.TcpServer("127.0.0.1", 0)
    server.start()
    with Errors() as errors:
        yield server, errors
    server.close()


def _connection_errors() -> int:
    return counters["coordinator_conn_error"] + counters["coordinator_conn"]


def _good_rank_is_served(aggregator, address, roots) -> None:
    """A real CoordinatorClient (rank 1) logs in and its message reaches rank 0's handler."""
    got: list = []
    aggregator.handlers.on_reference("test.ping", lambda rank, message: got.append(rank))
    client = coordinator_client.CoordinatorClient(address, 1)
    try:
        client.send({"t": "test.ping"})
        assert wait_until(lambda: got == [1]), "a good rank is still served"
        assert wait_until(lambda: 1 in aggregator.connected_ranks())
    finally:
        client.close(5)


def test_decode_returns_a_typed_object_or_raises_bad_message() -> None:
    @FUZZ
    @given(lines)
    def check(line: bytes) -> None:
        try:
            message = messages.decode(line)
        except messages.BadMessage:
            return
        assert isinstance(message["t"], str)

    check()


def _collective_item() -> messages.HorovodCollective:
    c = tl.Collective("grad_0", op="allreduce", dtype="float32", shape="[4]", backend="gloo")
    c.fused_group = 2
    return timeline._encode(c, tl.RankView(1.5, 2.0, 3.25, 2.5, True, "stamp"))


# one well-formed body of every known type, as the product builds them
GOOD = {
    "hello": {"t": "hello", "rank": 1, "mac": "ab" * 32, "cn": "cd" * 16},
    "challenge": {"t": "challenge", "n": "ef" * 16},
    "welcome": {"t": "welcome", "mac": "ab" * 32},
    "extent": dict(messages.extent("keras_train", 3, 10, 20)),
    "bye": {"t": "bye"},
    messages.EXTENTS: dict(messages.relay_extents("keras_train", 3, [[1, 10, 20, None]])),
    messages.JOIN: {"t": messages.JOIN, "r": 1},
    messages.LEAVE: {"t": messages.LEAVE, "r": 1},
    messages.VIA: {"t": messages.VIA, "r": 2, "m": dict(messages.ops_request(4))},
    messages.TO: {"t": messages.TO, "r": 2, "m": {"t": "hvd.done"}},
    messages.OPS_WINDOW: dict(messages.ops_window({"keras_train": 12}, 5)),
    messages.OPS_REQUEST: dict(messages.ops_request(4)),
    messages.HVD_RECORDS: {"t": "hvd.c", "k": "k", "s": 1, "sh": -5, "c": [_collective_item()]},
    messages.HVD_DONE: {"t": "hvd.done"},
    messages.HVD_ARRIVALS: {"t": "hvd.a", "k": "k", "s": 1, "a": {"grad_0": 123}},
    messages.HVD_LAST: {"t": "hvd.l", "k": "k", "s": 1, "l": {"grad_0": [123, 1]}},
    messages.HVD_BEGAN: {"t": "hvd.b", "k": "k", "s": 1, "b": 1_795_768_639_810_373_000},
    messages.STALL_ASK: dict(messages.stall_ask(3, "keras_train", 8)),
    messages.STALL_WHERE: {
        "t": messages.STALL_WHERE,
        "q": 3,
        "f": ["keras_train", 8, 21_000_000_000],
        "d": ["keras_train", 7, 21_000_000_000],
        "n": "keras.train_function",
        "s": [["hang", "/job/train.py", 40], ["<module>", "/job/train.py", 66]],
    },
}
# per type, a wrong value for each of its fields (None: the field removed)
WRONG = [None, "x", 1.5, True, -1, 2**63, [], {}, {"a": "b"}, [1, 2, 3]]


def test_every_known_type_is_checked() -> None:
    known = set(messages.COORDINATOR_TYPES) | {
        messages.OPS_WINDOW,
        messages.OPS_REQUEST,
        messages.HVD_RECORDS,
        messages.HVD_DONE,
        messages.HVD_ARRIVALS,
        messages.HVD_LAST,
        messages.HVD_BEGAN,
        messages.STALL_ASK,
        messages.STALL_WHERE,
    }
    assert set(GOOD) == known


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_well_formed_bodies_pass_and_keep_their_bytes(kind: str) -> None:
    line = messages.encode(GOOD[kind])
    assert messages.decode(line) == GOOD[kind]
    assert messages.encode(messages.decode(line)) == line


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_a_malformed_field_of_each_type_is_rejected_by_name(kind: str) -> None:
    """Ground truth: each field of each type, broken in each way that breaks it, is named;
    the control (the same body unbroken) passes above."""
    rejected = 0
    for name in [f for f in GOOD[kind] if f != "t"]:
        for wrong in WRONG:
            body = dict(GOOD[kind])
            if wrong is None:
                del body[name]
            else:
                body[name] = wrong
            try:
                messages.decode(messages.encode(body))
            except messages.BadMessage as exc:
                assert kind in str(exc)
                assert repr(name) in str(exc) or (name == "c" and "collective" in str(exc))
                rejected += 1
    fields = len(GOOD[kind]) - 1
    assert rejected >= fields * 6  # every field refuses most of WRONG (some are right: -1 an int)


def test_malformed_collectives_are_rejected() -> None:
    good = dict(_collective_item())
    breaks = {
        "n": 3,
        "o": None,
        "d": 4,
        "f": "1",
        "v": [1.0, 2.0, 3.0, 4.0, True],  # five, not six
    }
    for name, wrong in breaks.items():
        item = dict(good, **{name: wrong})
        body = dict(GOOD[messages.HVD_RECORDS], c=[good, item])
        with pytest.raises(messages.BadMessage, match="collective"):
            messages.decode(messages.encode(body))
    for view in ([1.0, float("nan"), 3, 4, True, "s"], [1e400, 2, 3, 4, False, "s"]):
        body = dict(GOOD[messages.HVD_RECORDS], c=[dict(good, v=view)])
        with pytest.raises(messages.BadMessage):
            messages.decode(json.dumps(body).encode())  # NaN / Infinity: JSON that Python reads


def _typed_body(kind: str):
    """Bodies of ``kind`` whose fields are the right ones, each with an arbitrary value."""
    good = GOOD[kind]
    fields = {name: json_values | st.just(value) for name, value in good.items() if name != "t"}
    return st.fixed_dictionaries({"t": st.just(kind), **fields})


def test_what_decode_accepts_the_real_handlers_take(monkeypatch) -> None:
    """hvd.c (a rank's collective records), hvd.b (a rank's step start, on rank 0) and the
    op-tracing window, fuzzed field by field: rejected by decode, or handled without an
    exception."""
    monkeypatch.setattr(ops_hook, "controller", ops_hook.OpsController())
    hvd = timeline.TimelineHook()  # no pipeline: records are built, then not emitted
    handlers = {
        messages.HVD_RECORDS: hvd.on_message,
        messages.HVD_BEGAN: lambda message: hvd.on_began(1, message),
        messages.OPS_WINDOW: ops_hook._on_window,
    }
    accepted = []

    @FUZZ
    @given(st.sampled_from(sorted(handlers)).flatmap(_typed_body))
    def check(body: dict) -> None:
        try:
            message = messages.decode(json.dumps(body).encode())
        except messages.BadMessage:
            return
        accepted.append(message["t"])
        handlers[message["t"]](message)  # raises: the test fails

    check()
    for kind, handler in handlers.items():  # the control: the product's own bodies
        handler(messages.decode(messages.encode(GOOD[kind])))
    assert ops_hook.controller.windows == {"keras_train": (12, 17)}


def test_malformed_bodies_from_a_rank_are_counted_and_never_handled(live_coordinator) -> None:
    aggregator, address, roots, errors = live_coordinator
    key = job_secret.job_key().key
    got: list = []
    aggregator.handlers.on_reference(messages.OPS_REQUEST, lambda rank, m: got.append(m))
    bad = [
        {"t": messages.OPS_REQUEST, "n": "5"},
        {"t": messages.OPS_REQUEST},
        {"t": messages.EXTENT, "k": "fuzz", "s": 0, "a": 9, "b": 3},  # ends before it starts
        {"t": messages.HVD_ARRIVALS, "k": "k", "s": 0, "a": {"x": "late"}},
    ]
    before = counters["coordinator_bad_message"]
    sock, welcomed = coordinator_login(address, 2, key)
    assert welcomed
    payload = b"".join(messages.encode(m) for m in bad)
    send_and_drain(sock, payload + messages.encode({"t": messages.OPS_REQUEST, "n": 7}))
    assert wait_until(lambda: got == [{"t": messages.OPS_REQUEST, "n": 7}]), "control handled"
    assert counters["coordinator_bad_message"] - before == len(bad)
    assert not [r for r in roots if r[0] == "fuzz"]
    assert not errors.seen


def test_strangers_are_refused_and_counted(live_coordinator) -> None:
    aggregator, address, roots, errors = live_coordinator

    @FUZZ
    @given(lines)
    def check(payload: bytes) -> None:
        refused, before = counters["coordinator_refused"], _connection_errors()
        send_and_drain(socket.create_connection(address, timeout=5), payload)
        assert wait_until(lambda: counters["coordinator_refused"] == refused + 1)
        assert _connection_errors() == before

    check()
    assert not errors.seen
    assert not aggregator.connected_ranks(), "no stranger got a rank's seat"
    _good_rank_is_served(aggregator, address, roots)


def test_garbage_from_an_authenticated_rank_is_counted_never_raised(live_coordinator) -> None:
    aggregator, address, roots, errors = live_coordinator
    key = job_secret.job_key().key

    @FUZZ
    @given(lines)
    def check(payload: bytes) -> None:
        before = _connection_errors()
        sock, welcomed = coordinator_login(address, 2, key)
        assert welcomed
        send_and_drain(sock, payload)
        assert _connection_errors() == before

    check()
    assert not errors.seen
    _good_rank_is_served(aggregator, address, roots)


def test_wrong_key_or_rank_is_refused(live_coordinator) -> None:
    aggregator, address, roots, errors = live_coordinator
    key = job_secret.job_key().key

    @FUZZ
    @given(st.binary(min_size=32, max_size=32), st.booleans(), st.integers(-5, 10))
    def check(wrong: bytes, right_key: bool, rank: int) -> None:
        refused = counters["coordinator_refused"]
        sock, welcomed = coordinator_login(address, rank, key if right_key else wrong)
        sock.close()
        legit = right_key and 0 < rank < 3
        assert welcomed == legit
        if not legit:
            assert wait_until(lambda: counters["coordinator_refused"] > refused)

    check()
    assert not errors.seen
    _good_rank_is_served(aggregator, address, roots)


clock_payloads = st.one_of(
    st.binary(max_size=200),
    st.lists(
        st.tuples(st.integers(0, 255), st.integers(0, 2**64 - 1)).map(
            lambda f: transport.FRAME.pack(*f)
        ),
        max_size=4,
    ).map(b"".join),
    st.binary(max_size=300).map(lambda b: transport.FRAME.pack(transport.REPORT, len(b)) + b),
    json_values.map(lambda v: json.dumps(v).encode()).map(
        lambda b: transport.FRAME.pack(transport.REPORT, len(b)) + b
    ),
)


def test_clock_service_refuses_strangers_and_survives_garbage(live_clock) -> None:
    server, errors = live_clock
    key = job_secret.job_key().key

    @FUZZ
    @given(clock_payloads, st.booleans())
    def check(payload: bytes, authenticated: bool) -> None:
        refused = counters["clock_refused"]
        if authenticated:
            sock, ok = clock_login("127.0.0.1", server.port, 1, key)
            assert ok
        else:
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        send_and_drain(sock, payload)
        if not authenticated:
            assert wait_until(lambda: counters["clock_refused"] > refused)

    check()
    assert not errors.seen
    assert all(isinstance(r, dict) for r in server.reports.values())
    client = transport.TcpClient("127.0.0.1", server.port, rank=1)
    client.connect(timeout=5)
    try:
        assert len(client.exchange(8, timeout=5)) == 8, "a good rank is still served"
    finally:
        client.close()


def test_clock_client_refuses_a_server_without_the_key() -> None:
    """A process squatting on the clock port (here: one with another key) is not trusted."""
    impostor = transport.TcpServer(
        "127.0.0.1", 0, secret=job_secret.JobKey(b"x" * 32, "TF_OTEL_JOB_SECRET")
    )
    impostor.start()
    try:
        client = transport.TcpClient("127.0.0.1", impostor.port, rank=1)
        with pytest.raises(OSError):
            client.connect(timeout=5)
        assert not client.connected
    finally:
        impostor.close()


def test_struct_frames_of_every_kind_do_not_hang(live_clock) -> None:
    """Each frame kind, alone, after a proper login: the server answers or closes."""
    server, errors = live_clock
    key = job_secret.job_key().key
    for kind in range(0, 6):
        sock, ok = clock_login("127.0.0.1", server.port, 1, key)
        assert ok
        send_and_drain(sock, struct.pack("<B7xQ", kind, 7))
    assert not errors.seen
