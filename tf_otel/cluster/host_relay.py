"""Per-host aggregation of the step reports: the relay one rank of each host (its leader) runs. It
serves the host's ranks and holds ONE connection to rank 0 for all of them, so rank 0 reads one
message per host and step instead of one per rank, and holds one connection per host.

Usage (the leader's RelayRoute starts it; benches and tests directly)::

    relay = HostRelay(address, rank, world_size, wait_s); relay.serve()
    relay.serve_local([9, 10]); relay.report_local(key, step, [(9, a, b), (10, a, b)])
    relay.leave_local([9, 10]); relay.close(timeout_s)  # ranks without their loopback hop

The relay (on an event loop of its own) serves 127.0.0.1 with rank 0's handshake and framing,
holds a step's extents until every rank connected to it reported or ``wait_s`` passed, then
sends them in one message; a late extent goes up at once, before the host's later steps, so
roots (and the verdicts judged as they go out) stay in step order. Which rank leads and where
each rank connects: cluster/relay_route.py. Design and failure modes: docs/ARCHITECTURE.md
("Per-host aggregation"), docs/guides/RELIABILITY.md ("Host relays").
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

from tf_otel.cluster import messages
from tf_otel.cluster.coordinator import MAX_LINE, MAX_PENDING_STEPS, MAX_UNSENT_BYTES
from tf_otel.cluster.coordinator_client import CoordinatorClient
from tf_otel.cluster.framing import LineConnection, decode_or_count, lines_from
from tf_otel.cluster.handshake import accept_hello
from tf_otel.cluster.serve_loop import loop_error, run_loop
from tf_otel.health import count, log_once
from tf_otel.job import job_secret

MAX_RANKS_A_HOST = 1024  # connections a relay serves at once (a host's ranks, with room)
LEAVE_WAIT_S = 1.0  # a leader that exits waits this long for its host's ranks to say bye
_PREFIX_TO = b'{"t":"%s","r":' % messages.TO.encode()

Address = Tuple[str, int]


@dataclass(slots=True)
class _Step:
    """One step's extents of the host's ranks, waiting to go up: [rank, start, end, wait]."""

    timer: Optional[asyncio.TimerHandle] = None
    extents: Dict[int, List[Any]] = field(default_factory=dict)


class HostRelay:
    """The leader's relay: its host's ranks in, one link to rank 0 out."""

    def __init__(
        self,
        upstream: Address,
        rank: int,
        world_size: int,
        wait_s: float,
        secret: Optional[job_secret.JobKey] = None,
        max_queue: int = 4096,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.wait_s = wait_s
        self.secret = secret or job_secret.job_key()
        self.address: Optional[Address] = None
        self._upstream_address = upstream
        self._upstream: Optional[CoordinatorClient] = None
        self._max_queue = max_queue
        self._ranks: Dict[int, asyncio.StreamWriter] = {}  # the host's ranks connected now
        self._pending: OrderedDict[Tuple[str, int], _Step] = OrderedDict()
        # the steps sent up (bounded): a host rank's extent of one of them goes up at once
        self._sent: OrderedDict[Tuple[str, int], None] = OrderedDict()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._server: Optional[asyncio.base_events.Server] = None
        self._connections = 0

    def serve(self) -> Optional[Address]:
        """Listen on loopback (any port) and link to rank 0; the address, or None."""
        loop = asyncio.new_event_loop()
        try:
            server = loop.run_until_complete(
                loop.create_server(lines_from(self._connection, MAX_LINE), "127.0.0.1", 0)
            )
        except OSError as exc:
            loop.close()
            log_once("relay_bind", "tf_otel: host relay cannot listen (%s); ranks go direct", exc)
            return None
        loop.set_exception_handler(loop_error)
        self._loop, self._server = loop, server
        self.address = server.sockets[0].getsockname()[:2]
        self._upstream = CoordinatorClient(
            self._upstream_address,
            self.rank,
            self._max_queue,
            secret=self.secret,
            relay=True,
            on_line=self._from_rank0,
        )
        threading.Thread(target=run_loop, args=(loop,), name="tf_otel-relay", daemon=True).start()
        return self.address

    def ranks(self) -> List[int]:
        """The host's ranks connected to this relay now (tests, benches)."""
        while True:
            try:  # read from another thread than the relay's loop, which changes it
                return sorted(self._ranks)
            except RuntimeError:
                continue

    def _others(self, own_rank: Optional[int]) -> bool:
        return bool(set(self.ranks()) - {own_rank})

    @property
    def linked(self) -> bool:
        """Whether its link to rank 0 is connected now."""
        upstream = self._upstream
        return upstream is not None and upstream.connected_to is not None

    # -- ranks in this process, without their loopback connection (benches, tests) ------------

    def serve_local(self, ranks: List[int]) -> bool:
        """Serve ``ranks`` as if each had connected and passed its hello (JOIN to rank 0);
        what rank 0 sends them is dropped. Any thread; False if the relay's loop is closed."""
        return self._on_loop(self._join_local, list(ranks))

    def report_local(self, key: str, step: int, extents: List[Tuple[int, int, int]]) -> bool:
        """Local ranks' (rank, start, end) of a step, as their extent lines give them."""
        return self._on_loop(self._report_local, key, step, extents)

    def leave_local(self, ranks: List[int]) -> bool:
        """Local ranks leave, as on their bye (LEAVE to rank 0)."""
        return self._on_loop(self._leave_local, list(ranks))

    def _on_loop(self, callback: Callable[..., None], *args: Any) -> bool:
        loop = self._loop
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the relay is closing
            return False
        return True

    def _join_local(self, ranks: List[int]) -> None:
        for rank in ranks:
            self._joined(rank, cast(asyncio.StreamWriter, _LocalRank()))

    def _report_local(self, key: str, step: int, extents: List[Tuple[int, int, int]]) -> None:
        for rank, start, end in extents:
            if rank in self._ranks:
                line: messages.Message = {"k": key, "s": step, "a": start, "b": end}
                self._add(rank, line)

    def _leave_local(self, ranks: List[int]) -> None:
        for rank in ranks:
            if rank in self._ranks:
                self._left(rank)

    def _joined(self, rank: int, writer: asyncio.StreamWriter) -> None:
        """A rank served from now on (its hello passed, or a local one): JOIN to rank 0."""
        self._ranks[rank] = writer
        self._up(messages.encode({"t": messages.JOIN, "r": rank}))

    def _left(self, rank: int) -> None:
        """A served rank gone: the steps whole without it go up now, then LEAVE to rank 0."""
        del self._ranks[rank]
        for key_step, entry in list(self._pending.items()):
            if set(self._ranks) <= set(entry.extents):  # whole without it
                self._flush(key_step)
        self._up(messages.encode({"t": messages.LEAVE, "r": rank}))

    # -- the host's ranks (on the relay's loop) -----------------------------------------------

    async def _connection(self, reader: LineConnection, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if self._connections >= MAX_RANKS_A_HOST:
            count("coordinator_refused")
            writer.close()
            return
        self._connections += 1
        rank: Optional[int] = None
        try:
            accepted = await accept_hello(
                reader, writer, peer, self.secret.key, self.world_size, relays=False
            )
            if accepted is not None:
                rank, _, welcome = accepted
                writer.write(welcome)
                self._joined(rank, writer)
                await reader.serve(partial(self._rank_line, rank))
        except OSError:  # the rank died: its LEAVE below
            pass
        except Exception as exc:  # noqa: BLE001 - a peer's bytes must not raise
            count("coordinator_conn_error")
            log_once("relay_conn", "tf_otel: host relay connection ended (%s)", exc)
        finally:
            self._connections -= 1
            if rank is not None and self._ranks.get(rank) is writer:
                self._left(rank)
            writer.close()

    def _rank_line(self, rank: int, line: bytes) -> bool:
        """A served rank's line, from its connection's ``data_received`` (False: it said bye).
        A line over MAX_LINE (the connection's limit, serve) ends the connection, counted."""
        message = decode_or_count(line)
        if message is None:
            return True
        kind = message["t"]
        if kind == messages.EXTENT:
            self._add(rank, message)
        elif kind == messages.BYE:
            return False
        elif kind in messages.COORDINATOR_TYPES:
            count("coordinator_bad_message")
        else:  # an extension message: up as it came, named by its rank
            self._up(messages.wrap(messages.VIA, rank, line))
        return True

    def _add(self, rank: int, message: messages.Message) -> None:
        key_step = (message["k"], message["s"])
        extent = [rank, message["a"], message["b"], message.get("w")]
        if key_step in self._sent:
            # a rank behind the wait (or its first steps, queued while it connected): the step
            # went up without it, the others will not report it again. Up now, in its order:
            # waiting again would let the host's next steps, whole with it, go first (rank 0
            # judges the roots in the order they go out)
            self._up(messages.encode(messages.relay_extents(key_step[0], key_step[1], [extent])))
            return
        entry = self._pending.get(key_step)
        if entry is None:
            assert self._loop is not None
            entry = self._pending[key_step] = _Step()
            entry.timer = self._loop.call_later(self.wait_s, self._flush, key_step)
            while len(self._pending) > MAX_PENDING_STEPS:  # bounded: the oldest goes now
                self._flush(next(iter(self._pending)))
        entry.extents[rank] = extent
        if set(self._ranks) <= set(entry.extents):  # every rank of the host reported it
            self._flush(key_step)

    def _flush(self, key_step: Tuple[str, int]) -> None:
        """A step's extents up to rank 0 in one message (a late one comes in a later one)."""
        entry = self._pending.pop(key_step, None)
        if entry is None:
            return
        if entry.timer is not None:
            entry.timer.cancel()
        self._sent[key_step] = None
        while len(self._sent) > MAX_PENDING_STEPS:
            self._sent.popitem(last=False)
        extents = list(entry.extents.values())
        self._up(messages.encode(messages.relay_extents(key_step[0], key_step[1], extents)))

    def _up(self, data: bytes) -> None:
        if self._upstream is not None:
            self._upstream.send_bytes(data)

    # -- rank 0's messages (on the link's reader thread) --------------------------------------

    def _from_rank0(self, line: bytes) -> None:
        """A broadcast: the same bytes to every rank here; TO: its inner bytes to its rank."""
        loop = self._loop
        if loop is None:
            return
        try:
            if line.startswith(_PREFIX_TO):  # rank 0's wrap(): {"t":"to","r":N,"m":...}
                comma = line.index(b",", len(_PREFIX_TO))
                rank = int(line[len(_PREFIX_TO) : comma])
                if not line.startswith(b',"m":', comma) or not line.endswith(b"}\n"):
                    raise ValueError("not a wrapped message")
                loop.call_soon_threadsafe(self._deliver, rank, line[comma + 5 : -2] + b"\n")
            else:
                loop.call_soon_threadsafe(self._fan_out, line)
        except ValueError:
            count("coordinator_bad_message")
        except RuntimeError:  # the loop is closed: the relay is closing
            pass

    def _deliver(self, rank: int, data: bytes) -> None:
        writer = self._ranks.get(rank)
        if writer is None:  # it left, or reconnected elsewhere: rank 0 routes there next
            count("relay_undelivered")
            return
        _write_bounded(writer, data)

    def _fan_out(self, data: bytes) -> None:
        for writer in list(self._ranks.values()):
            _write_bounded(writer, data)

    # -- end ------------------------------------------------------------------------------------

    def close(self, timeout_s: float, own_rank: Optional[int] = None) -> None:
        """Wait (up to LEAVE_WAIT_S) for the host's other ranks to say bye, send what waits
        and bye to rank 0, then stop: ranks still here connect again elsewhere."""
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return
        deadline = time.monotonic() + min(timeout_s, LEAVE_WAIT_S)
        while self._others(own_rank) and time.monotonic() < deadline:
            time.sleep(0.02)
        done = threading.Event()

        def flush_all() -> None:
            for key_step in list(self._pending):
                self._flush(key_step)
            done.set()

        try:
            loop.call_soon_threadsafe(flush_all)
            done.wait(1.0)
        except RuntimeError:
            pass
        if self._upstream is not None:
            self._upstream.close(timeout_s)
        self.abort()

    def abort(self) -> None:
        """Stop now: connections end (the host's ranks connect again), nothing more goes up."""
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return
        writers = list(self._ranks.values())

        def shut() -> None:
            server.close()
            for writer in writers:
                writer.transport.abort()
            loop.stop()

        try:
            loop.call_soon_threadsafe(shut)
        except RuntimeError:  # already closed
            pass


class _LocalRank:
    """A local rank's stand-in for its connection (serve_local): what is sent to it is
    dropped, as its client would read and drop a message it has no handler for."""

    def __init__(self) -> None:
        self.transport = self

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        pass


def _write_bounded(writer: asyncio.StreamWriter, data: bytes) -> None:
    transport = writer.transport
    if transport.is_closing():
        return
    if transport.get_write_buffer_size() + len(data) > MAX_UNSENT_BYTES:
        count("coordinator_send_dropped")  # the rank does not read: never unbounded
        return
    writer.write(data)
