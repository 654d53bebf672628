"""Reading newline-delimited messages off a peer's stream: the loop rank 0's coordinator
(pipeline/coordinator.py) and a host relay (pipeline/host_relay.py) run for every connection.

Usage::

    while True:
        got = await next_message(reader)  # reader: asyncio.StreamReader(limit=MAX_LINE)
        if got is None:
            return  # the peer closed, or its stream broke
        line, message = got  # the raw line (forwarded as is) and its checked message

The length limit is the reader's own (``limit=`` where the server is started): a longer line
ends the connection, counted ``coordinator_bad_message``. A line that fails decoding is
dropped and counted the same way (the first one logged), and the next line is read.
"""

from __future__ import annotations

import asyncio
from typing import Optional, Tuple

from tf_otel.health import count, log_once
from tf_otel.pipeline.messages import BadMessage, Message, decode


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


async def next_message(reader: asyncio.StreamReader) -> Optional[Tuple[bytes, Message]]:
    """The peer's next good message with its line; None once the connection is done with."""
    while True:
        try:
            line = await reader.readline()
        except ValueError:  # longer than the reader's limit: a peer never sends this, it broke
            count("coordinator_bad_message")
            return None
        if not line:
            return None
        if not line.endswith(b"\n"):
            continue  # the last, unterminated line of a connection that ends
        message = decode_or_count(line)
        if message is not None:
            return line, message
