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
    message = decode(line)                                         # None: not a message
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Mapping, Optional, TypedDict

from tf_otel.health import count, log_once

Message = Dict[str, Any]  # a decoded message
Outgoing = Mapping[str, Any]  # a message to send: one of the TypedDicts below, or a test's
ReferenceHandler = Callable[[int, Message], None]  # (sending rank, message), on rank 0
RankHandler = Callable[[Message], None]  # on a rank, from rank 0

# the coordinator's own types
HELLO = "hello"  # rank -> 0: {"rank", "mac", "cn"}
CHALLENGE = "challenge"  # 0 -> rank: {"n": nonce}
WELCOME = "welcome"  # 0 -> rank: {"mac"}
EXTENT = "extent"  # rank -> 0: Extent
BYE = "bye"  # rank -> 0: the rank is done
COORDINATOR_TYPES = (HELLO, CHALLENGE, WELCOME, EXTENT, BYE)

# extension types: sources' messages, dispatched to the pipeline's handlers
OPS_WINDOW = "tf_otel.ops.window"  # 0 -> ranks: OpsWindow
OPS_REQUEST = "tf_otel.ops.request"  # rank -> 0: OpsRequest
HVD_RECORDS = "hvd.c"  # 0 -> rank: HorovodRecords
HVD_DONE = "hvd.done"  # 0 -> ranks: rank 0 has sent every step's records
HVD_ARRIVALS = "hvd.a"  # rank -> 0: HorovodArrivals
HVD_LAST = "hvd.l"  # 0 -> ranks: HorovodLast


class Extent(TypedDict):
    """A rank's step extent in reference time: key "k", step "s", start "a", end "b" (ns)."""

    t: str
    k: str
    s: int
    a: int
    b: int


class OpsWindow(TypedDict):
    """On-demand op tracing: first traced step "w" by step key, for "n" steps."""

    t: str
    w: Dict[str, int]
    n: int


class OpsRequest(TypedDict):
    """A rank asks rank 0 for "n" op-traced steps on every rank."""

    t: str
    n: int


class HorovodRecords(TypedDict):
    """Rank 0's collective records for one rank's step: key "k", step "s", clock shift "sh",
    records "c" (``instrument.horovod`` encodes each)."""

    t: str
    k: str
    s: int
    sh: int
    c: List[Dict[str, Any]]


class HorovodArrivals(TypedDict):
    """A rank's arrival time at each collective of a step: {tensor name: ns} in "a"."""

    t: str
    k: str
    s: int
    a: Dict[str, int]


class HorovodLast(TypedDict):
    """Rank 0's answer: per collective, the last rank to arrive and when, in "l"."""

    t: str
    k: str
    s: int
    l: Dict[str, List[int]]  # noqa: E741 - the wire's key


def extent(key: str, step: int, start_ns: int, end_ns: int) -> Extent:
    return {"t": EXTENT, "k": key, "s": step, "a": start_ns, "b": end_ns}


def ops_window(starts: Dict[str, int], steps: int) -> OpsWindow:
    return {"t": OPS_WINDOW, "w": starts, "n": int(steps)}


def ops_request(steps: int) -> OpsRequest:
    return {"t": OPS_REQUEST, "n": int(steps)}


def encode(message: Outgoing) -> bytes:
    """One message -> its line (compact JSON, newline-terminated)."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> Optional[Message]:
    """One message line -> its JSON object with a string type "t"; None for anything else."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested beyond the stack
        return None
    if not isinstance(message, dict) or not isinstance(message.get("t"), str):
        return None
    return message


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
