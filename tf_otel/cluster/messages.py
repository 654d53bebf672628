"""Cross-rank messages: their types, their one encoding, and the handlers of one pipeline.

Every message between a rank and rank 0 (coordinator connection) is one JSON object on one line,
its type in ``"t"``. The wire keeps short keys (a Horovod step's records travel in one line);
each type's ``TypedDict`` below names them. ``encode`` / ``decode`` are the only (de)serialisers.

Handlers belong to a pipeline (``Pipeline.handlers``), not to a module: sources register theirs
through ``lifecycle.with_pipeline`` once the process's pipeline exists.

Usage::

    handlers = Handlers()
    handlers.on_reference(OPS_REQUEST, lambda rank, message: ...)  # rank 0, from a rank
    handlers.on_rank(OPS_WINDOW, lambda message: ...)              # a rank, from rank 0
    line = encode(ops_window({"keras_train": 12}, 5))
    message = decode(line)  # the checked message; BadMessage (names the field) for anything else

Every body is checked on receipt, by its type: a known type's fields must have the types (and
bounds) its ``TypedDict`` names, so a handler never sees a malformed body of a known type. An
unknown type passes with only its ``"t"`` checked (its handler, if any, owns it). Receivers count
and drop a ``BadMessage``.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, TypedDict

from tf_otel.health import count, log_once

Message = Dict[str, Any]  # decoded: a known type is one of the TypedDicts below, checked
Outgoing = Mapping[str, Any]  # a message to send: one of the TypedDicts below, or a test's
ReferenceHandler = Callable[[int, Message], None]  # (sending rank, message), on rank 0
RankHandler = Callable[[Message], None]  # on a rank, from rank 0

# the coordinator's own types
HELLO = "hello"  # rank -> 0: {"rank", "mac", "cn"}
CHALLENGE = "challenge"  # 0 -> rank: {"n": nonce}
WELCOME = "welcome"  # 0 -> rank: {"mac"}
EXTENT = "extent"  # rank -> 0: Extent
BYE = "bye"  # rank -> 0: the rank is done
# a host relay (cluster/host_relay.py) <-> rank 0: the host's ranks on one connection
EXTENTS = "extents"  # relay -> 0: RelayExtents (one step, several ranks)
JOIN = "relay.join"  # relay -> 0: rank "r" is now served through this relay
LEAVE = "relay.leave"  # relay -> 0: rank "r" said bye or its connection ended
VIA = "via"  # relay -> 0: rank "r"'s extension message "m"
TO = "to"  # 0 -> relay: extension message "m" for rank "r" (a broadcast goes as it is)
RELAY_TYPES = (EXTENTS, JOIN, LEAVE, VIA, TO)
COORDINATOR_TYPES = (HELLO, CHALLENGE, WELCOME, EXTENT, BYE, *RELAY_TYPES)

# extension types: sources' messages, dispatched to the pipeline's handlers
OPS_WINDOW = "tf_otel.ops.window"  # 0 -> ranks: OpsWindow
OPS_REQUEST = "tf_otel.ops.request"  # rank -> 0: OpsRequest
HVD_RECORDS = "hvd.c"  # 0 -> rank: HorovodRecords
HVD_DONE = "hvd.done"  # 0 -> ranks: rank 0 has sent every step's records
HVD_ARRIVALS = "hvd.a"  # rank -> 0: HorovodArrivals
HVD_LAST = "hvd.l"  # 0 -> ranks: HorovodLast
HVD_BEGAN = "hvd.b"  # rank -> 0: HorovodBegan
STALL_ASK = "tf_otel.stall.ask"  # 0 -> ranks: StallAsk ("where are you")
STALL_WHERE = "tf_otel.stall.where"  # rank -> 0: StallWhere (the answer)
TWIN_READY = "tf_otel.twin.ready"  # rank -> 0: TwinReady (instrument/detail_twin_gate.py)
TWIN_OPEN = "tf_otel.twin.open"  # 0 -> ranks: TwinOpen


class Extent(TypedDict, total=False):
    """A rank's step extent in reference time: key "k", step "s", start "a", end "b" (ns); its
    input wait "w" (ns) where the rank measured it."""

    t: str
    k: str
    s: int
    a: int
    b: int
    w: int


class RelayExtents(TypedDict):
    """A host relay's extents of step "s" of key "k": "e" = [[rank, start, end, input wait
    (null: not measured)], ...], one per rank of the host that reported (at most
    MAX_RELAY_RANKS)."""

    t: str
    k: str
    s: int
    e: List[List[Any]]


class OpsWindow(TypedDict):
    """On-demand op tracing: first traced step "w" by step key, for "n" steps."""

    t: str
    w: Dict[str, int]
    n: int


class TwinReady(TypedDict):
    """A rank has prepared the detail generations "p" (its twins, TF1 runs); "g": the last."""

    t: str
    g: int
    p: List[int]


class TwinOpen(TypedDict):
    """Rank 0: every rank prepared generations "p"; they run from step "w" by key."""

    t: str
    g: int
    p: List[int]
    w: Dict[str, int]


class OpsRequest(TypedDict):
    """A rank asks rank 0 for "n" op-traced steps on every rank."""

    t: str
    n: int


class HorovodCollective(TypedDict):
    """One collective in ``HorovodRecords``: tensor "n", op "o", dtype "d", shape "p", backend
    "b", fused group "f", and the rank's view "v" = [arrival, last ready, end, transfer start
    (us, rank 0's clock), last arrival (bool), how the arrival is known]."""

    n: str
    o: str
    d: Optional[str]
    p: Optional[str]
    b: Optional[str]
    f: Optional[int]
    v: List[Any]


class HorovodRecords(TypedDict):
    """Rank 0's collective records for one rank's step: key "k", step "s", clock shift "sh",
    records "c" (``instrument.horovod`` encodes each)."""

    t: str
    k: str
    s: int
    sh: int
    c: List[HorovodCollective]


class HorovodArrivals(TypedDict):
    """A rank's arrival time at each collective of a step: {tensor name: ns} in "a"."""

    t: str
    k: str
    s: int
    a: Dict[str, int]


class HorovodBegan(TypedDict):
    """A rank began step "s" of key "k" at "b" (reference ns): rank 0 reads its timeline's
    response-cache hits with it (who began after a negotiation started did not start it)."""

    t: str
    k: str
    s: int
    b: int


class HorovodLast(TypedDict, total=False):
    """Rank 0's answer: per collective, the last rank to arrive and when, in "l"; "g": groups of
    tensors that completed together (one span each), where asked for."""

    t: str
    k: str
    s: int
    l: Dict[str, List[int]]  # noqa: E741 - the wire's key
    g: List[List[str]]


class StallAsk(TypedDict, total=False):
    """Rank 0's question "where are you" (query "q"), about its step "s" of key "k" that stalls;
    "x": 0 for a probe (answer only; rank 0 is between steps and looks whether the others are
    in one), else the rank also exports its step in flight."""

    t: str
    q: int
    k: str
    s: int
    x: int


class StallWhere(TypedDict, total=False):
    """A rank's answer to query "q": its step in flight "f" and its last completed step of the
    asked key "d", each [key, step, ns since it began / ended] or null; the in-flight step's
    name "n" ("" if none); its training thread's stack "s", innermost first, [function, file,
    line] per frame (never a value); optional: the collectives built into its step's graph "c",
    [count, [[op, name], ...]], and its last eager collective "l", [op, name, ns since] or
    null (cluster.step_collectives)."""

    t: str
    q: int
    f: Optional[List[Any]]
    d: Optional[List[Any]]
    n: str
    s: List[List[Any]]
    c: List[Any]
    l: Optional[List[Any]]  # noqa: E741 - one-letter wire names, as every message here


MAX_STACK_FRAMES = 48  # frames of a rank's training stack in a StallWhere
MAX_FRAME_TEXT = 512  # a frame's function or file name


def extent(
    key: str, step: int, start_ns: int, end_ns: int, wait_ns: Optional[int] = None
) -> Extent:
    message: Extent = {"t": EXTENT, "k": key, "s": step, "a": start_ns, "b": end_ns}
    if wait_ns is not None:
        message["w"] = max(0, int(wait_ns))
    return message


def relay_extents(key: str, step: int, extents: List[List[Any]]) -> RelayExtents:
    return {"t": EXTENTS, "k": key, "s": step, "e": extents}


def wrap(kind: str, rank: int, line: bytes) -> bytes:
    """A VIA or TO line around an encoded message ``line`` (its bytes kept: never encoded
    again, so a broadcast or a large record is encoded once)."""
    return b'{"t":"%s","r":%d,"m":%s}\n' % (kind.encode(), rank, line.rstrip(b"\n"))


def ops_window(starts: Dict[str, int], steps: int) -> OpsWindow:
    return {"t": OPS_WINDOW, "w": starts, "n": int(steps)}


def ops_request(steps: int) -> OpsRequest:
    return {"t": OPS_REQUEST, "n": int(steps)}


MAX_GENERATIONS = 256  # generations one twin message names (the newest)


def twin_ready(generations: List[int]) -> TwinReady:
    named = sorted(int(g) for g in generations)[-MAX_GENERATIONS:]
    return {"t": TWIN_READY, "g": named[-1] if named else 0, "p": named}


def twin_open(generations: List[int], starts: Dict[str, int]) -> TwinOpen:
    named = sorted(int(g) for g in generations)[-MAX_GENERATIONS:]
    return {
        "t": TWIN_OPEN,
        "g": named[-1] if named else 0,
        "p": named,
        "w": {k: int(v) for k, v in starts.items()},
    }


def stall_ask(query: int, key: str, step: int, export: bool = True) -> StallAsk:
    return {"t": STALL_ASK, "q": int(query), "k": key, "s": int(step), "x": int(export)}


def encode(message: Outgoing) -> bytes:
    """One message -> its line (compact JSON, newline-terminated)."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


class BadMessage(ValueError):
    """A line that is not a well-formed message; its text names the bad field and value."""


def decode(line: bytes) -> Message:
    """One message line -> its JSON object, checked against its type's fields (below).
    Raises ``BadMessage`` naming what is wrong; never anything else."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as exc:  # RecursionError: "[[[[..." beyond the stack
        raise BadMessage(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict):
        raise BadMessage(f"not a JSON object: {_show(message)}")
    kind = message.get("t")
    if not isinstance(kind, str):
        raise BadMessage(f"no string type 't': {_show(kind)}")
    check = _CHECKS.get(kind)
    if check is not None:
        check(message)
    return message


def check(message: Any) -> Message:
    """A decoded object (a VIA's inner message) checked as ``decode`` checks a line's."""
    if not isinstance(message, dict) or not isinstance(message.get("t"), str):
        raise BadMessage(f"not a message object: {_show(message)}")
    fields = _CHECKS.get(message["t"])
    if fields is not None:
        fields(message)
    return message


# -- the checks: one per known type; they raise BadMessage naming the type, field and value ----

MAX_KEY_LEN = 512  # a step key; longer is garbage
MAX_TEXT_LEN = 4096  # handshake strings (hex nonces, MACs)
_MAX_NUMBER = 1 << 63  # ns and steps fit an int64 (OTLP's times); larger is garbage


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _bad(message: Message, name: str, want: str) -> BadMessage:
    value = message.get(name, "<missing>")
    return BadMessage(f"{message['t']}: field {name!r} must be {want}, got {_show(value)}")


def _int(value: Any) -> bool:
    """An int64 (not a bool, which is an int in Python)."""
    return type(value) is int and -_MAX_NUMBER <= value < _MAX_NUMBER


def _need_int(message: Message, name: str, minimum: Optional[int] = None) -> None:
    value: Any = message.get(name)
    if not _int(value) or (minimum is not None and value < minimum):
        low = "-2**63" if minimum is None else minimum
        raise _bad(message, name, f"an int in [{low}, 2**63)")


def _need_text(message: Message, name: str, limit: int) -> None:
    value = message.get(name)
    if not isinstance(value, str) or len(value) > limit:
        raise _bad(message, name, f"a string of at most {limit} characters")


def _need_key_step(message: Message) -> None:
    _need_text(message, "k", MAX_KEY_LEN)
    _need_int(message, "s", 0)


def _ints(values: Any) -> bool:
    """Every value an int64 (type and bounds tested in C: these lists have a value per tensor)."""
    values = list(values)
    if not values:
        return True
    return (
        set(map(type, values)) == {int}
        and min(values) >= -_MAX_NUMBER
        and max(values) < _MAX_NUMBER
    )


def _need_int_map(message: Message, name: str) -> None:
    value = message.get(name)
    if not isinstance(value, dict) or not _ints(value.values()):
        raise _bad(message, name, "an object of ints")


def _check_extent(message: Message) -> None:
    _need_key_step(message)
    _need_int(message, "a", 0)
    _need_int(message, "b", message["a"])  # ends after it starts
    if "w" in message:
        _need_int(message, "w", 0)


MAX_RELAY_RANKS = 4096  # ranks in one RelayExtents: a host's, with room


def _relay_extents_ok(items: List[Any]) -> bool:
    """Each item [rank >= 1, start >= 0, end >= start, wait >= 0 or null], ints below 2**63.
    One plain loop: rank 0 checks one such list a host and step, and this form measured ~3x
    faster than a helper call per item."""
    for item in items:
        if type(item) is not list or len(item) != 4:
            return False
        rank, start, end, wait = item
        if type(rank) is not int or type(start) is not int or type(end) is not int:
            return False
        if not (1 <= rank < _MAX_NUMBER and 0 <= start <= end < _MAX_NUMBER):
            return False
        if wait is not None and (type(wait) is not int or not 0 <= wait < _MAX_NUMBER):
            return False
    return True


def _check_relay_extents(message: Message) -> None:
    _need_key_step(message)
    items = message.get("e")
    if (
        type(items) is not list
        or not 0 < len(items) <= MAX_RELAY_RANKS
        or not _relay_extents_ok(items)
    ):
        raise _bad(message, "e", f"1 to {MAX_RELAY_RANKS} [rank, start, end, wait] lists")


def _check_wrapped(message: Message) -> None:
    _need_int(message, "r", 0)
    inner = message.get("m")
    if not isinstance(inner, dict) or not isinstance(inner.get("t"), str):
        raise _bad(message, "m", "a message object")


def _check_hello(message: Message) -> None:
    _need_int(message, "rank")
    _need_text(message, "mac", MAX_TEXT_LEN)
    _need_text(message, "cn", MAX_TEXT_LEN)


def _check_ops_window(message: Message) -> None:
    _need_int_map(message, "w")
    _need_int(message, "n")


def _check_twin_ready(message: Message) -> None:
    _need_int(message, "g", 0)
    value = message.get("p")
    if not isinstance(value, list) or len(value) > MAX_GENERATIONS or not _ints(value):
        raise _bad(message, "p", f"a list of at most {MAX_GENERATIONS} ints")


def _check_twin_open(message: Message) -> None:
    _check_twin_ready(message)
    _need_int_map(message, "w")


def _check_records(message: Message) -> None:
    _need_key_step(message)
    _need_int(message, "sh")
    items = message.get("c")
    if not isinstance(items, list):
        raise _bad(message, "c", "a list of collectives")
    if not _collectives_ok(items):
        for item in items:  # name the first bad one (the slow path: only for a bad message)
            if not _collectives_ok([item]):
                raise BadMessage(f"{message['t']}: a collective in 'c' is malformed: {_show(item)}")


_NONE, _STR = type(None), str


def _collectives_ok(items: List[Any]) -> bool:
    """Every item a ``HorovodCollective``: n, o strings; d, p, b string or null; f int or null;
    v the rank's view [arrival, last ready, end, transfer start (finite numbers), last arrival
    (bool), how (string)]. Field by field over all items (a step has thousands at most)."""
    if not items:
        return True
    if set(map(type, items)) != {dict}:
        return False
    column = [[item.get(name) for item in items] for name in ("n", "o", "d", "p", "b", "f", "v")]
    names, ops, dtypes, shapes, backends, groups, views = column
    if set(map(type, names + ops)) != {_STR}:
        return False
    if set(map(type, dtypes + shapes + backends)) - {_STR, _NONE}:
        return False
    present = [g for g in groups if g is not None]
    if present and not _ints(present):
        return False
    if set(map(type, views)) != {list} or set(map(len, views)) != {6}:
        return False
    numbers = [x for view in views for x in view[:4]]
    if set(map(type, numbers)) - {int, float}:
        return False
    try:
        if not all(map(math.isfinite, numbers)) or max(map(abs, numbers)) >= _MAX_NUMBER:
            return False
    except OverflowError:  # an int too large for a float
        return False
    return set(type(view[4]) for view in views) == {bool} and {type(view[5]) for view in views} == {
        _STR
    }


def _check_arrivals(message: Message) -> None:
    _need_key_step(message)
    _need_int_map(message, "a")


def _check_began(message: Message) -> None:
    _need_key_step(message)
    _need_int(message, "b", 0)


def _check_last(message: Message) -> None:
    _need_key_step(message)
    last = message.get("l")
    pairs = list(last.values()) if isinstance(last, dict) else None
    if (
        pairs is None
        or set(map(type, pairs)) - {list}
        or set(map(len, pairs)) - {2}
        or not _ints([x for pair in pairs for x in pair])
    ):
        raise _bad(message, "l", "an object of [ns, rank] pairs")


def _check_stall_ask(message: Message) -> None:
    _need_int(message, "q", 0)
    _need_key_step(message)
    if "x" in message and (type(message["x"]) is not int or message["x"] not in (0, 1)):
        raise _bad(message, "x", "0 or 1")


def _where_ok(value: Any) -> bool:
    """null, or [key, step, ns]: a short key, a step >= 0, ns >= 0."""
    if value is None:
        return True
    return (
        type(value) is list
        and len(value) == 3
        and isinstance(value[0], str)
        and len(value[0]) <= MAX_KEY_LEN
        and _int(value[1])
        and _int(value[2])
        and value[1] >= 0
        and value[2] >= 0
    )


def _frame_ok(frame: Any) -> bool:
    return (
        type(frame) is list
        and len(frame) == 3
        and isinstance(frame[0], str)
        and isinstance(frame[1], str)
        and len(frame[0]) <= MAX_FRAME_TEXT
        and len(frame[1]) <= MAX_FRAME_TEXT
        and _int(frame[2])
    )


def _check_stall_where(message: Message) -> None:
    _need_int(message, "q", 0)
    for name in ("f", "d"):
        if name not in message or not _where_ok(message[name]):
            raise _bad(message, name, "null or [key, step >= 0, ns >= 0]")
    _need_text(message, "n", MAX_KEY_LEN)
    stack = message.get("s")
    if type(stack) is not list or len(stack) > MAX_STACK_FRAMES or not all(map(_frame_ok, stack)):
        raise _bad(message, "s", f"at most {MAX_STACK_FRAMES} [function, file, line] frames")
    if "c" in message and not _held_ok(message["c"]):
        raise _bad(message, "c", f"[count >= 0, at most {MAX_STALL_COLLECTIVES} [op, name]]")
    last = message.get("l")
    if last is not None and not (
        type(last) is list
        and len(last) == 3
        and _names_ok(last[:2])
        and _int(last[2])
        and last[2] >= 0
    ):
        raise _bad(message, "l", "null or [op, name, ns >= 0]")


MAX_STALL_COLLECTIVES = 16  # [op, name] pairs in a StallWhere


def _names_ok(pair: Any) -> bool:
    return (
        type(pair) is list
        and len(pair) == 2
        and all(isinstance(x, str) and len(x) <= MAX_FRAME_TEXT for x in pair)
    )


def _held_ok(value: Any) -> bool:
    """A StallWhere's "c": [count, [[op, name], ...]]."""
    return (
        type(value) is list
        and len(value) == 2
        and _int(value[0])
        and value[0] >= 0
        and type(value[1]) is list
        and len(value[1]) <= MAX_STALL_COLLECTIVES
        and all(map(_names_ok, value[1]))
    )


_CHECKS: Dict[str, Callable[[Message], None]] = {
    HELLO: _check_hello,
    CHALLENGE: lambda m: _need_text(m, "n", MAX_TEXT_LEN),
    WELCOME: lambda m: _need_text(m, "mac", MAX_TEXT_LEN),
    EXTENT: _check_extent,
    BYE: lambda m: None,
    EXTENTS: _check_relay_extents,
    JOIN: lambda m: _need_int(m, "r", 1),
    LEAVE: lambda m: _need_int(m, "r", 1),
    VIA: _check_wrapped,
    TO: _check_wrapped,
    OPS_WINDOW: _check_ops_window,
    OPS_REQUEST: lambda m: _need_int(m, "n"),
    TWIN_READY: _check_twin_ready,
    TWIN_OPEN: _check_twin_open,
    HVD_RECORDS: _check_records,
    HVD_DONE: lambda m: None,
    HVD_ARRIVALS: _check_arrivals,
    HVD_LAST: _check_last,
    HVD_BEGAN: _check_began,
    STALL_ASK: _check_stall_ask,
    STALL_WHERE: _check_stall_where,
}


class Handlers:
    """One pipeline's extension-message handlers, run on coordinator threads. A handler that
    raises is logged once and counted; a type without a handler is counted."""

    def __init__(self) -> None:
        self._reference: Dict[str, ReferenceHandler] = {}
        self._rank: Dict[str, RankHandler] = {}

    def on_reference(self, kind: str, handler: ReferenceHandler) -> None:
        """On rank 0: ``handler(rank, message)`` for each message of ``kind`` from a rank."""
        self._reference[kind] = handler

    def on_rank(self, kind: str, handler: RankHandler) -> None:
        """On a rank: ``handler(message)`` for each message of ``kind`` from rank 0."""
        self._rank[kind] = handler

    def at_reference(self, rank: int, message: Message) -> None:
        _run(self._reference.get(message["t"]), rank, message)

    def at_rank(self, message: Message) -> None:
        _run(self._rank.get(message["t"]), message)


def _run(handler: Optional[Callable[..., None]], *args: Any) -> None:
    if handler is None:
        count("coordinator_unhandled")
        return
    try:
        handler(*args)
    except Exception as exc:  # noqa: BLE001
        log_once("coordinator_handler", "tf_otel: coordinator message handler failed (%s)", exc)
