"""The event loop thread that rank 0's coordinator and each host relay serve their connections
from: one thread a server, no thread per connection.

Usage::

    loop = asyncio.new_event_loop(); server = loop.run_until_complete(loop.create_server(...))
    loop.set_exception_handler(loop_error)
    threading.Thread(target=run_loop, args=(loop,), daemon=True).start()
    loop.call_soon_threadsafe(write_open, writer, data)   # from any thread
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict

from tf_otel.health import count, log_once


def write_open(writer: asyncio.StreamWriter, data: bytes) -> None:
    """On the loop: queue bytes for a rank (its transport sends them as the socket allows)."""
    if not writer.transport.is_closing():
        writer.write(data)


def run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The coordinator's thread: serve until close(), then end the connections' tasks."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.close()


def loop_error(loop: asyncio.AbstractEventLoop, context: Dict[str, Any]) -> None:
    """What escapes a connection's task or a callback: counted and logged once, never raised
    (asyncio's default prints a traceback on stderr). A connection's handshake task
    (framing.lines_from) cancelled as the loop closes is no error."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    count("coordinator_conn_error")
    log_once(
        "coordinator_loop",
        "tf_otel: coordinator event loop error (%s)",
        context.get("exception") or context.get("message"),
    )
