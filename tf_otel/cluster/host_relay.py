"""Per-host aggregation of the step reports: one rank of each host (its relay leader) serves the
host's ranks and holds ONE connection to rank 0 for all of them, so rank 0 reads one message per
host and step instead of one per rank, and holds one connection per host.

Usage (done by cluster.services)::

    client = coordinator_link(settings, topology, address, handlers)  # a rank > 0
    client.report(key, step, start_ns, end_ns, wait_ns)  # to the host's relay (or rank 0)
    election = lead_directly(topology)   # rank 0: its host's ranks talk to it directly
    close_link(client, timeout_s)        # a leader's relay goes with it

    relay = HostRelay(address, rank, world_size, wait_s); relay.serve()  # benches, tests:
    relay.serve_local([9, 10]); relay.report_local(key, step, [(9, a, b), (10, a, b)])
    relay.leave_local([9, 10]); relay.close(timeout_s)  # ranks without their loopback hop

The leader is elected as the clock's host share is (host_election.py), with a lock file of its
own so that each leader's death is survived on its own. The relay (``HostRelay``, on an event
loop of its own) serves 127.0.0.1 with rank 0's handshake and framing, holds a step's extents
until every rank connected to it reported or ``wait_s`` passed, then sends them in one message;
a late extent goes up at once, before the host's later steps, so roots (and the verdicts judged
as they go out) stay in step order. Ranks on rank 0's host go to rank 0 directly. When a leader
dies its ranks connect again through the next lock holder (``RelayRoute``), else rank 0; the
steps the dead relay held go out partial. On by default where a host runs several ranks;
TF_OTEL_HOST_RELAY=0 turns it off. Design and failure modes: docs/ARCHITECTURE.md ("Per-host
aggregation"), docs/guides/RELIABILITY.md ("Host relays").
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union, cast

from tf_otel.cluster import messages
from tf_otel.cluster.coordinator import (
    MAX_LINE,
    MAX_PENDING_STEPS,
    MAX_UNSENT_BYTES,
    accept_hello,
    loop_error,
    run_loop,
)
from tf_otel.cluster.coordinator_client import CoordinatorClient
from tf_otel.cluster.exit_deadline import Deadline
from tf_otel.cluster.framing import LineConnection, decode_or_count, lines_from
from tf_otel.cluster.messages import Handlers
from tf_otel.config import Settings
from tf_otel.health import count, log_once
from tf_otel.host_election import let_go, private_dir, sweep_once, take_lock
from tf_otel.job import job_secret
from tf_otel.job.topology import Topology, resolve_address

RELAY_WAIT_MAX_S = 0.25  # a step's extents wait this long at most for the host's other ranks
FIND_LEADER_S = 2.0  # a rank that lost the election waits this long for the leader's address
RELAY_TRIES = 3  # tries in a row at one relay address (each failed or ended), then rank 0 once
MAX_RANKS_A_HOST = 1024  # connections a relay serves at once (a host's ranks, with room)
LEAVE_WAIT_S = 1.0  # a leader that exits waits this long for its host's ranks to say bye
DIRECT = "direct"  # published by rank 0 for its own host: talk to rank 0 directly
_PREFIX_TO = b'{"t":"%s","r":' % messages.TO.encode()

Address = Tuple[str, int]


class HostElection:
    """The host's relay leader for one job: an flock and the leader's published address."""

    def __init__(self, directory: Path, name: str) -> None:
        self.lock_path = directory / f"relay-{name}.lock"
        self.address_path = directory / f"relay-{name}.json"
        self._fd: Optional[int] = None
        self._token = ""

    @classmethod
    def for_job(cls, job_id: str, host: str, key: bytes = b"") -> Optional[HostElection]:
        """The election of ``host`` in a job; ``key`` (the job key) keeps apart two jobs that
        share an id (a multi-host launch without one is "unknown") but not their secret."""
        directory = private_dir()
        if directory is None:
            return None
        sweep_once(directory, "relay")  # the files of elections long left by their leaders
        digest = hashlib.sha256(f"{job_id}\0{host}\0".encode() + key)
        return cls(directory, digest.hexdigest()[:24])

    @property
    def leading(self) -> bool:
        return self._fd is not None

    def claim(self) -> bool:
        """Lead the host if nobody alive does; True while this holder leads."""
        if self._fd is not None:
            return True
        fd = take_lock(self.lock_path)
        if fd is None:
            return False
        # a token, not the pid: ranks simulated as threads of one process are leaders apart
        self._token = secrets.token_hex(8)
        os.ftruncate(fd, 0)
        os.pwrite(fd, self._token.encode(), 0)
        self._fd = fd
        return True

    def publish(self, address: Optional[Address]) -> None:
        """The leader's relay address (None: the host's ranks go to rank 0 directly)."""
        if self._fd is None:
            return
        data = {"token": self._token, "address": list(address) if address else DIRECT}
        tmp = self.address_path.with_suffix(f".{self._token}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(data, out)
        os.replace(tmp, self.address_path)

    def read(self) -> Union[None, str, Address]:
        """The live leader's relay address, DIRECT, or None (none published yet)."""
        try:
            token = self.lock_path.read_text().strip()
            data = json.loads(self.address_path.read_text())
            if not token or data.get("token") != token:
                return None
            address = data["address"]
            if address == DIRECT:
                return DIRECT
            host, port = address
            return str(host), int(port)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def release(self) -> None:
        """Let go of the lead: the files first (the lock still held, so they are this leader's;
        the next leader creates them again), then the lock."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        temp = self.address_path.with_suffix(f".{self._token}.tmp")  # a publish cut short
        let_go(fd, self.lock_path, self.address_path, temp)


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


class RelayRoute:
    """Where a rank connects on each try: its own relay (it won the election), the leader's,
    or rank 0 (rank 0's host, no leader found, no relay possible)."""

    def __init__(
        self,
        election: HostElection,
        coordinator: Address,
        rank: int,
        world_size: int,
        wait_s: float,
        secret: Optional[job_secret.JobKey] = None,
        max_queue: int = 4096,
        skip_on_rank0_host: bool = False,
    ) -> None:
        self.election = election
        self.coordinator = coordinator
        # by default a rank on rank 0's own host talks to it directly, whoever wins the lock
        self.skip_on_rank0_host = skip_on_rank0_host
        self._rank0_here: Optional[bool] = None
        self.rank = rank
        self.world_size = world_size
        self.wait_s = wait_s
        self.secret = secret
        self.max_queue = max_queue
        self.relay: Optional[HostRelay] = None  # this rank leads: its relay
        self._lock = threading.Lock()
        self._last: Optional[Address] = None  # the relay address given last, and how often
        self._tries = 0

    def __call__(self) -> Address:
        if self.skip_on_rank0_host:
            if self._rank0_here is None:  # looked up once, on the client's connecting thread
                # a Horovod launch names rank 0 by a rendezvous lookup (kv+http://...), no host:
                # resolved first (OSError while rank 0 has not published: this try fails)
                self._rank0_here = on_this_host(resolve_address(self.coordinator)[0])
            if self._rank0_here:
                return self.coordinator
        with self._lock:
            if self.relay is not None and self.relay.address is not None:
                return self.relay.address
            if self.election.claim():
                return self._lead()
        deadline = time.monotonic() + FIND_LEADER_S
        while True:  # the leader publishes its address right after it took the lock
            found = self.election.read()
            if found == DIRECT:
                return self.coordinator
            if isinstance(found, tuple):
                return self._at_most_tries(found)
            if time.monotonic() > deadline:
                count("relay_not_found")
                return self.coordinator
            time.sleep(0.02)

    def _at_most_tries(self, found: Address) -> Address:
        """``found``, unless it was given RELAY_TRIES times in a row: a new call means the try
        before failed or its connection ended, and a leader that refuses this rank (it is not
        this job's) must not keep it from rank 0."""
        self._tries = self._tries + 1 if found == self._last else 1
        self._last = found
        if self._tries > RELAY_TRIES:
            self._tries = 0
            count("relay_given_up")
            return self.coordinator
        return found

    def _lead(self) -> Address:
        relay = HostRelay(
            self.coordinator,
            self.rank,
            self.world_size,
            self.wait_s,
            self.secret,
            self.max_queue,
        )
        address = relay.serve()
        if address is None:  # no relay here: nobody leads, every rank goes direct
            self.election.publish(None)
            return self.coordinator
        self.relay = relay
        self.election.publish(address)
        return address

    def close(self, timeout_s: float) -> None:
        with self._lock:
            relay, self.relay = self.relay, None
        if relay is not None:
            relay.close(timeout_s, own_rank=self.rank)
        self.election.release()  # another rank of the host takes over, if any still runs


def on_this_host(host: str) -> bool:
    """Whether ``host`` (rank 0's address) is this machine: an address a socket here can bind
    (loopback, or one of this host's interfaces)."""
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, kind, _, _, address in found:
        try:
            with socket.socket(family, kind) as probe:
                probe.bind((address[0], 0))
            return True
        except OSError:
            continue
    return False


def relay_wanted(settings: Settings, topology: Topology) -> bool:
    """Relays on (TF_OTEL_HOST_RELAY, default 1) and this host runs several ranks."""
    return bool(settings.host_relay) and topology.local_size > 1


def coordinator_link(
    settings: Settings,
    topology: Topology,
    address: Address,
    handlers: Optional[Handlers] = None,
    secret: Optional[job_secret.JobKey] = None,
    rank0_host_direct: bool = True,
) -> CoordinatorClient:
    """A rank's link to rank 0: through its host's relay where relays are on (and a private
    directory for the election exists), else directly. ``rank0_host_direct``: a rank whose
    rank-0 address is this machine's goes directly (False: one machine simulating hosts)."""
    route: Optional[RelayRoute] = None
    if relay_wanted(settings, topology):
        secret = secret or job_secret.job_key()
        election = HostElection.for_job(topology.job_id, topology.host, secret.key)
        if election is not None:
            route = RelayRoute(
                election,
                address,
                topology.rank,
                topology.step_world_size,
                min(RELAY_WAIT_MAX_S, settings.root_wait_ms / 4000.0),
                secret,
                settings.max_queue,
                skip_on_rank0_host=rank0_host_direct,
            )
    return CoordinatorClient(
        address, topology.rank, settings.max_queue, secret=secret, handlers=handlers, route=route
    )


def close_link(client: CoordinatorClient, timeout_s: float) -> None:
    """Close a rank's link, then its relay if it leads one (its followers' byes first), within
    ``timeout_s`` in all."""
    deadline = Deadline(timeout_s)
    client.close(deadline.left())
    if isinstance(client.route, RelayRoute):
        client.route.close(deadline.left())


def lead_directly(
    settings: Settings, topology: Topology, secret: Optional[job_secret.JobKey] = None
) -> Optional[HostElection]:
    """Rank 0: lead its own host's election and publish "direct" (its host's ranks talk to it
    directly); the election to release at the end, or None."""
    if not relay_wanted(settings, topology):
        return None
    key = (secret or job_secret.job_key()).key
    election = HostElection.for_job(topology.job_id, topology.host, key)
    if election is None or not election.claim():
        return None
    election.publish(None)
    return election
