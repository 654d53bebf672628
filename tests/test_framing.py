"""cluster.framing.LineConnection over real loopback TCP: lines awaited one at a time, then
handed to a callback as they arrive, with the limits and endings of a StreamReader's readline."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Callable, Coroutine, List, Tuple

import pytest

from tf_otel.cluster.framing import LineConnection, lines_from
from tf_otel.health import counters

LIMIT = 64


def _serve_once(
    body: Callable[[LineConnection, asyncio.StreamWriter], Coroutine[Any, Any, Any]],
    send: Callable[[socket.socket], None],
) -> Any:
    """Run ``body`` on the one connection a client makes, the client sending with ``send``
    (then closing); body's result."""

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[Any] = loop.create_future()

        async def on_connect(connection: LineConnection, writer: asyncio.StreamWriter) -> None:
            try:
                outcome.set_result(await body(connection, writer))
            except Exception as exc:  # noqa: BLE001 - handed to the test
                outcome.set_exception(exc)
            finally:
                writer.close()

        server = await loop.create_server(lines_from(on_connect, LIMIT), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        def client() -> None:
            with socket.create_connection(("127.0.0.1", port)) as sock:
                send(sock)

        await loop.run_in_executor(None, client)
        try:
            return await asyncio.wait_for(outcome, 10)
        finally:
            server.close()

    return asyncio.run(main())


def _lines(*lines: bytes) -> Callable[[socket.socket], None]:
    def send(sock: socket.socket) -> None:
        for line in lines:
            sock.sendall(line)

    return send


def test_readline_then_serve_hands_every_line_over_in_order() -> None:
    async def body(connection: LineConnection, _: Any) -> Tuple[bytes, List[bytes]]:
        hello = await connection.readline()
        got: List[bytes] = []
        await connection.serve(lambda line: got.append(line) is None)
        return hello, got

    # the client sends everything at once: the lines after the hello wait for serve
    hello, got = _serve_once(body, _lines(b"hello\nA\nB\n", b"C\nD\n"))
    assert hello == b"hello\n"
    assert got == [b"A\n", b"B\n", b"C\n", b"D\n"]


def test_a_line_in_pieces_is_one_line_and_an_unterminated_end_is_not_served() -> None:
    async def body(connection: LineConnection, _: Any) -> List[bytes]:
        got: List[bytes] = []
        await connection.serve(lambda line: got.append(line) is None)
        return got

    def send(sock: socket.socket) -> None:
        for piece in (b"ab", b"c\nde", b"f\n", b"cut"):
            sock.sendall(piece)
            sock.recv(0)

    assert _serve_once(body, send) == [b"abc\n", b"def\n"]


def test_readline_after_the_peer_closed_gives_the_rest_then_nothing() -> None:
    async def body(connection: LineConnection, _: Any) -> List[bytes]:
        return [await connection.readline() for _ in range(3)]

    assert _serve_once(body, _lines(b"one\ntwo")) == [b"one\n", b"two", b""]


def test_the_callback_saying_false_ends_serving() -> None:
    async def body(connection: LineConnection, _: Any) -> List[bytes]:
        got: List[bytes] = []
        await connection.serve(lambda line: (got.append(line), line != b"bye\n")[1])
        return got

    assert _serve_once(body, _lines(b"a\nbye\nafter\n")) == [b"a\n", b"bye\n"]


def test_what_the_callback_raises_reaches_the_connection() -> None:
    def on_line(line: bytes) -> bool:
        raise KeyError(line)

    async def body(connection: LineConnection, _: Any) -> None:
        await connection.serve(on_line)

    with pytest.raises(KeyError):
        _serve_once(body, _lines(b"x\n"))


def test_a_line_over_the_limit_refuses_the_handshake() -> None:
    async def body(connection: LineConnection, _: Any) -> bytes:
        return await connection.readline()

    with pytest.raises(ValueError, match="over the limit"):
        _serve_once(body, _lines(b"x" * (LIMIT + 10) + b"\n"))


@pytest.mark.parametrize("ended", [True, False], ids=["line end", "no line end"])
def test_a_line_over_the_limit_ends_serving_counted(ended: bool) -> None:
    async def body(connection: LineConnection, _: Any) -> List[bytes]:
        got: List[bytes] = []
        await connection.serve(lambda line: got.append(line) is None)
        return got

    before = counters["coordinator_bad_message"]
    long = b"x" * (LIMIT + 10) + (b"\n" if ended else b"")
    got = _serve_once(body, _lines(b"ok\n" + long + b"\nlater\n"))
    assert got == [b"ok\n"]  # nothing after the long line is heard
    assert counters["coordinator_bad_message"] == before + 1


def test_a_line_exactly_at_the_limit_passes() -> None:
    async def body(connection: LineConnection, _: Any) -> bytes:
        return await connection.readline()

    line = b"y" * LIMIT + b"\n"  # as a StreamReader(limit=LIMIT): the limit is before the end
    assert _serve_once(body, _lines(line)) == line
