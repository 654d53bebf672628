"""Reading newline-delimited messages off a peer's stream: the protocol rank 0's coordinator
(cluster/coordinator.py) and each host relay (cluster/host_relay.py) serve their
connections with.

Usage::

    server = await loop.create_server(lines_from(on_connect, MAX_LINE), host, port)
    # on_connect(connection, writer): a coroutine a connection; in it:
    line = await connection.readline()           # the handshake, a line at a time
    await connection.serve(on_line)              # then on_line(line) as lines arrive, on the
                                                 # loop, until it returns False or the peer ends
    message = decode_or_count(line)              # in on_line: the checked message, or None

The length limit is the connection's own (``limit``, as a ``StreamReader``'s): a longer line
ends the connection, counted ``coordinator_bad_message``. An unterminated last line of a
connection that ends is not served. A line that fails decoding is dropped and counted the
same way (the first one logged), and the next line is read.

``LineConnection`` hands each line to its callback from ``data_received``: no task wakes up
for a line. At 1,024 simulated ranks the stream reader's per-line wake-ups (a future, a task
step, ``readuntil``) were ~40 % of rank 0's coordinator loop (docs/benchmarks/rank0.md).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable, Coroutine, Deque, Optional

from tf_otel.cluster.messages import BadMessage, Message, decode
from tf_otel.health import count, log_once


def decode_or_count(line: bytes) -> Optional[Message]:
    """A checked message, or None: a bad one, counted."""
    try:
        return decode(line)
    except BadMessage as exc:
        log_once(  # counts every time, logs the first: which field of what was bad
            "coordinator_bad_message",
            "tf_otel: dropped a malformed coordinator message (%s); later ones are only counted",
            exc,
        )
        return None


class LineConnection(asyncio.Protocol):
    """A peer's newline-delimited stream: lines awaited one at a time (``readline``, as an
    ``asyncio.StreamReader``'s), then handed to a callback as they arrive (``serve``)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._lines: Deque[bytes] = deque()  # complete lines not yet read
        self._ended = False  # the peer closed
        self._error: Optional[BaseException] = None  # how its stream broke
        self._too_long = False
        self._waiter: Optional[asyncio.Future[None]] = None
        self._on_line: Optional[Callable[[bytes], bool]] = None
        self._done: Optional[asyncio.Future[None]] = None
        self.task: Optional[asyncio.Task[None]] = None  # the connection's coroutine

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        while not self._too_long:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = bytes(buffer[start : end + 1])
            start = end + 1
            if len(line) > self._limit + 1:
                self._too_long = True
            elif self._on_line is None:
                self._lines.append(line)
            else:
                self._dispatch(line)
        del buffer[:start]
        if len(buffer) > self._limit:  # no line end within the limit
            self._too_long = True
        if self._too_long:
            buffer.clear()
            if self._on_line is not None:
                count("coordinator_bad_message")  # a peer never sends this: it broke
                self._finish(None)
        self._wake()

    def eof_received(self) -> None:
        self._ended = True  # the transport closes: connection_lost follows

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._ended, self._error = True, exc
        self._wake()
        self._finish(exc)

    async def readline(self) -> bytes:
        """The next line with its end; the unterminated rest once the peer closed (b"" when
        none); ``ValueError`` for a line over the limit, the stream's error where it broke."""
        while not self._lines:
            if self._too_long:
                raise ValueError("a line over the limit")
            if self._error is not None:
                raise self._error
            if self._ended:
                rest = bytes(self._buffer)
                self._buffer.clear()
                return rest
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._lines.popleft()

    async def serve(self, on_line: Callable[[bytes], bool]) -> None:
        """``on_line(line)`` for every line from now on (those already read first) until it
        returns False or the peer closes; raises what ``on_line`` raised, or the stream's error.
        A line over the limit ends it, counted ``coordinator_bad_message``."""
        self._done = asyncio.get_running_loop().create_future()
        self._on_line = on_line
        while self._lines and not self._done.done():
            self._dispatch(self._lines.popleft())
        if self._too_long:
            count("coordinator_bad_message")
            self._finish(None)
        elif self._ended:
            self._finish(self._error)
        await self._done

    def _dispatch(self, line: bytes) -> None:
        done, on_line = self._done, self._on_line
        if done is None or done.done() or on_line is None:
            return  # finished: the rest is not heard
        try:
            if not on_line(line):
                done.set_result(None)
        except Exception as exc:  # noqa: BLE001 - the connection's coroutine handles it
            done.set_exception(exc)

    def _finish(self, exc: Optional[BaseException]) -> None:
        done = self._done
        if done is not None and not done.done():
            if exc is None:
                done.set_result(None)
            else:
                done.set_exception(exc)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def lines_from(
    on_connect: Callable[[LineConnection, asyncio.StreamWriter], Coroutine[Any, Any, None]],
    limit: int,
) -> Callable[[], LineConnection]:
    """A protocol factory for ``loop.create_server``: each connection a ``LineConnection``
    and ``on_connect(connection, writer)`` run as its task (``writer`` writes to the peer)."""

    class _Connection(LineConnection):
        def connection_made(self, transport: Any) -> None:
            loop = asyncio.get_running_loop()
            writer = asyncio.StreamWriter(transport, self, None, loop)
            self.task = loop.create_task(on_connect(self, writer))

    return lambda: _Connection(limit)
