"""Rank 0's small TCP service: ranks report each sampled step's extent (in reference time), rank 0
emits the step's root span once every rank has reported, so the root covers all ranks.

Newline-delimited JSON over one TCP connection per rank; never touched by the training thread.
Rank 0 serves every connection from one thread running an asyncio event loop (no thread per
connection: at a thousand ranks, py-spy found hundreds of connection threads queued on the
aggregator's lock); extents and extension messages are handled on it, messages to ranks are
queued onto it.
Every connection starts with a mutual HMAC handshake over the per-job key (job_secret.py;
cluster/handshake.py): rank 0 accepts only ranks that hold the key, a rank accepts messages only
from a rank 0 that does. Anything else is refused and counted (``coordinator_refused``); every
buffer is bounded.

A host relay (cluster/host_relay.py) serves the ranks of one host and holds ONE connection to
rank 0 for all of them: its hello says so (its MAC is bound to RELAY_SERVICE), it names each rank
it serves (JOIN / LEAVE), sends a step's extents of all its ranks in one EXTENTS message and their
extension messages wrapped in VIA. Rank 0 routes a message for such a rank to its relay wrapped
in TO, and a broadcast once per connection (the relay fans it out): each rank's route is its own
connection or its relay's. A relay's input is checked like a rank's (ranks in range and its
own, bounded sizes); anything else is counted as a bad message.

Usage (done by runtime.steps.Pipeline)::

    server = StepAggregator(world_size, wait_s, emit_root); server.serve(("127.0.0.1", port))
    # emit_root(key, step, start_ns, end_ns, n_ranks, reported): reported is the sorted tuple of
    # ranks that reported when the root is partial (some rank never did), else None
    # a rank's side: cluster/coordinator_client.py (CoordinatorClient)

Extension messages (``messages``) go to the ``Handlers`` each side is given: the pipeline's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from typing import (
    Callable,
    Dict,
    Iterable,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from tf_otel.clock.sync import SETTLE_MAX_S
from tf_otel.cluster import messages
from tf_otel.cluster.framing import LineConnection, decode_or_count, lines_from
from tf_otel.cluster.handshake import accept_hello, refuse
from tf_otel.cluster.messages import BadMessage, Handlers, Outgoing, encode
from tf_otel.cluster.serve_loop import loop_error, run_loop, write_open
from tf_otel.cluster.world import WorldHistory
from tf_otel.health import count, log_once
from tf_otel.job import job_secret

# emit_root(key, step, start_ns, end_ns, n_ranks, reported ranks if partial else None)
# a rank's extent of a step: start, end (reference ns), its input wait (None: not measured)
Extent = Tuple[int, int, Optional[int]]
# (key, step, start, end, ranks heard from, the ranks when partial, each rank's extent)
EmitRoot = Callable[[str, int, int, int, int, Optional[Tuple[int, ...]], Dict[int, Extent]], None]
MAX_PENDING_STEPS = 1024
ROOT_MARGIN_NS = 1000
MAX_HELD_MESSAGES = 1024
MAX_HELD_BYTES = 16 << 20  # per rank: messages held for a rank that has not connected yet
MAX_EMITTED_STEPS = 8192
LEARN_STEPS = 3
MAX_LINE = 1 << 20  # from a rank: extents and small requests; longer is garbage
MAX_UNSENT_BYTES = 64 << 20  # to a rank that does not read: beyond, messages are dropped
MAX_CONNECTIONS = 64  # at once, beyond the job's own ranks: a flood of strangers is refused
MIN_BACKLOG = 128  # the listen backlog: every rank may connect at once (the kernel caps it)


@dataclass(slots=True)
class _Pending:
    """One step's root to be: the union of the extents reported so far, since when (monotonic
    s, for the wait), and each rank's own (start, end, input wait)."""

    start: int
    end: int
    since: float
    extents: Dict[int, Extent] = field(default_factory=dict)


class StepAggregator:
    """Collects per-rank step extents; emits one root per (key, step)."""

    def __init__(
        self,
        world_size: int,
        wait_s: float,
        emit_root: EmitRoot,
        secret: Optional[job_secret.JobKey] = None,
        first_report_grace_s: float = SETTLE_MAX_S,
        handlers: Optional[Handlers] = None,
    ) -> None:
        self.world_size = world_size
        # ranks accepted: every rank of the largest world so far (a process keeps its first
        # rank when Horovod Elastic renumbers the survivors of a smaller world)
        self.rank_limit = world_size
        self.handlers = handlers or Handlers()  # extension messages from ranks
        self.secret = secret or job_secret.job_key()
        self.wait_s = wait_s
        self.first_report_grace_s = first_report_grace_s
        self.emit_root = emit_root
        self._pending: OrderedDict[Tuple[str, int], _Pending] = OrderedDict()
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._server: Optional[asyncio.base_events.Server] = None
        self.address: Optional[Tuple[str, int]] = None  # where serve() listens
        self._finished: set = set()  # ranks that said bye or dropped their connection
        # rank -> its route: its own connection, or its host relay's
        self._writers: Dict[int, asyncio.StreamWriter] = {}
        # a relay's connection -> the ranks it serves now, and every rank it ever served (its
        # late extents may name a rank that has left since)
        self._relayed: Dict[asyncio.StreamWriter, Set[int]] = {}
        self._served: Dict[asyncio.StreamWriter, Set[int]] = {}
        self._held: Dict[int, list] = {}  # rank -> messages sent before it connected (bounded)
        self._held_bytes: Dict[int, int] = {}
        self._connections = 0
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._emitted: OrderedDict[Tuple[str, int], None] = OrderedDict()  # bounded
        self._reporters: set = set()  # ranks that have reported any step
        self._late: Dict[int, int] = {}  # rank not yet a reporter -> its late extents so far
        self._hosts: Dict[int, str] = {}  # rank -> the address its connection came from
        self._left: Set[int] = set()  # ranks that left the world (``resize``)
        # the world of each step where it changed while the job ran (cluster/world.py)
        self.history: Optional[WorldHistory] = None
        self._reaper = threading.Thread(target=self._reap_loop, name="tf_otel-roots", daemon=True)
        self._reaper.start()

    def expected_ranks(self, world: Optional[int] = None) -> int:
        """How many reports let a step's root go out without waiting: every stepping rank at
        first; once a few steps are out, the ranks that actually report (TF2
        ParameterServerStrategy workers never do). Not what makes a root whole: see _emit.
        ``world``: the step's own (``world_of``), else the job's now."""
        size = self.world_size if world is None else world
        if len(self._emitted) < LEARN_STEPS:
            return size
        return max(1, min(size, len(self._reporters)))

    def world_of(self, key: str, step: int) -> int:
        """The ranks that ran ``step`` of ``key``: the job's world, or where it changed while
        the job ran (Horovod Elastic), the world of that step."""
        history = self.history
        return self.world_size if history is None else history.size_of(key, step)

    def host_of(self, rank: int) -> Optional[str]:
        """The address rank ``rank``'s connection (or its host relay's) came from, if known."""
        return self._hosts.get(rank)

    def finished_ranks(self) -> Set[int]:
        """The ranks that said bye or whose connection ended."""
        with self._lock:
            return set(self._finished)

    def resize(self, world_size: int, left: Iterable[int] = ()) -> None:
        """The world changed (a Horovod Elastic reset): steps of the new world wait for its
        ranks only (``left``: the ranks that left, no longer reporters); pending steps that
        now hold every rank of their own world go out."""
        ready: List[Tuple[Tuple[str, int], _Pending]] = []
        with self._lock:
            self.world_size = world_size
            self.rank_limit = max(self.rank_limit, world_size)
            self._reporters.difference_update(left)
            self._left.update(left)
            for key_step, entry in list(self._pending.items()):
                if len(entry.extents) >= self.expected_ranks(self.world_of(*key_step)):
                    ready.append(self._take(key_step))
        for key_step, done in ready:
            self._emit(key_step, done)

    def add(
        self,
        rank: int,
        key: str,
        step: int,
        start_ns: int,
        end_ns: int,
        wait_ns: Optional[int] = None,
    ) -> None:
        self.add_many(key, step, ((rank, start_ns, end_ns, wait_ns),))

    def add_many(
        self, key: str, step: int, extents: Iterable[Tuple[int, int, int, Optional[int]]]
    ) -> None:
        """Extents of one step, (rank, start, end, input wait) each: a rank's own, or the ranks
        of a host relay's message (the same root as had each come alone)."""
        batch = extents if isinstance(extents, (list, tuple)) else list(extents)
        if not batch:
            return
        ready: List[Tuple[Tuple[str, int], _Pending]] = []
        key_step = (key, step)
        with self._lock:
            reporters = self._reporters
            if key_step in self._emitted:
                # its root is out: a second one would split the step
                count("roots_late_extent", len(batch))
                if len(reporters) < self.world_size:
                    self._learn_late(batch)
                return
            entry = self._pending.get(key_step)
            if entry is None:
                entry = _Pending(batch[0][1], batch[0][2], time.monotonic())
                self._pending[key_step] = entry
                while len(self._pending) > MAX_PENDING_STEPS:
                    count("roots_forced")
                    ready.append(self._take(next(iter(self._pending))))
            # one pass, locals only: rank 0 runs this for every host's message of every step
            got, start, end = entry.extents, entry.start, entry.end
            for rank, start_ns, end_ns, wait_ns in batch:
                got[rank] = (start_ns, end_ns, wait_ns)
                if start_ns < start:
                    start = start_ns
                if end_ns > end:
                    end = end_ns
            entry.start, entry.end = start, end
            if len(reporters) < self.world_size:  # every rank has reported: nothing to learn
                reporters.update([item[0] for item in batch])
            world = self.world_size if self.history is None else self.world_of(key, step)
            if key_step in self._pending and len(got) >= self.expected_ranks(world):
                ready.append(self._take(key_step))
        for key_step, done in ready:
            self._emit(key_step, done)

    def _learn_late(self, batch: Sequence[Tuple[int, int, int, Optional[int]]]) -> None:
        """A rank none of whose extents came in time (connected after the first roots, then
        always behind them) reports all the same: after LEARN_STEPS late extents it is waited
        for, else roots go out without it for ever (seen at 4,096 simulated ranks). One stray
        late extent does not make a reporter. Under self._lock."""
        for item in batch:
            rank = item[0]
            if rank in self._reporters:
                continue
            late = self._late.get(rank, 0) + 1
            if late >= LEARN_STEPS:
                self._reporters.add(rank)
                self._late.pop(rank, None)
            else:
                self._late[rank] = late  # bounded: a rank of the job at most once

    def _take(self, key_step: Tuple[str, int]) -> Tuple[Tuple[str, int], _Pending]:
        """Take a step out of pending and mark it emitted in one change (under self._lock): an
        extent that arrives before the step's root is out is then late, never a second root."""
        entry = self._pending.pop(key_step)
        self._emitted[key_step] = None
        while len(self._emitted) > MAX_EMITTED_STEPS:
            self._emitted.popitem(last=False)
        return key_step, entry

    def _emit(self, key_step: Tuple[str, int], entry: _Pending) -> None:
        """Emit the root of a step _take took (outside self._lock: emit_root exports a span)."""
        ranks = entry.extents
        # partial: a rank of the job never reported (killed mid-step, too late, never connected);
        # judged against the job, not the learnt reporters, which may lack a rank that failed
        partial = tuple(sorted(ranks)) if len(ranks) < self.world_of(*key_step) else None
        if partial is not None:
            count("roots_partial")
        try:
            # 1 us of margin: backends that keep microseconds must still see children inside
            start, end = entry.start - ROOT_MARGIN_NS, entry.end + ROOT_MARGIN_NS
            self.emit_root(key_step[0], key_step[1], start, end, len(ranks), partial, ranks)
        except Exception as exc:  # noqa: BLE001
            log_once("emit_root", "tf_otel: cannot emit step root span (%s)", exc)

    def flush(self, timeout_s: float) -> None:
        """Wait up to timeout_s for outstanding ranks, then emit what is pending."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                # the ranks of the world now that said bye (not those that left it)
                if not self._pending or len(self._finished - self._left) >= self.world_size - 1:
                    break
            time.sleep(0.02)
        with self._lock:
            pending = [self._take(key_step) for key_step in list(self._pending)]
        for key_step, entry in pending:
            self._emit(key_step, entry)

    def _reap_loop(self) -> None:
        while not self._stop.wait(0.2):
            now = time.monotonic()
            late = []
            with self._lock:
                wait_s = self.wait_s
                # the union only while learning: a set of every rank, five times a second
                if len(self._emitted) < LEARN_STEPS and self.world_size > len(
                    self._reporters | self._finished
                ):
                    # a rank's first reports wait for its clock to settle (runtime/exporter.py, up
                    # to clock.sync.SETTLE_MAX_S): the first roots wait rather than go out partial
                    wait_s += self.first_report_grace_s
                for key_step, entry in list(self._pending.items()):
                    if now - entry.since > wait_s:
                        late.append(self._take(key_step))
            for key_step, entry in late:
                self._emit(key_step, entry)

    def serve(self, address: Tuple[str, int]) -> bool:
        """Listen on ``address`` (port 0: any; ``self.address`` says which) from one thread
        running an event loop: no thread per connection, so a thousand ranks connecting at once
        cost no thread each, and nothing waits behind a slow peer."""
        loop = asyncio.new_event_loop()
        backlog = max(MIN_BACKLOG, self.world_size + MAX_CONNECTIONS)  # every rank at once
        try:
            server = loop.run_until_complete(
                loop.create_server(
                    lines_from(self._connection, MAX_LINE),
                    address[0],
                    address[1],
                    backlog=backlog,
                    reuse_address=True,
                )
            )
        except OSError as exc:
            loop.close()
            log_once(
                "coordinator_bind",
                "tf_otel: cannot listen on %s:%s (%s); step roots will cover rank 0 only. "
                "Set TF_OTEL_COORDINATOR=host:port to a free port",
                address[0],
                address[1],
                exc,
            )
            return False
        loop.set_exception_handler(loop_error)
        self._loop, self._server = loop, server
        self.address = server.sockets[0].getsockname()[:2]
        job_secret.warn_if_weak(self.secret, address[0], "coordinator")
        threading.Thread(
            target=run_loop, args=(loop,), name="tf_otel-coordinator", daemon=True
        ).start()
        return True

    def _admit(self) -> bool:
        with self._lock:
            if self._connections >= MAX_CONNECTIONS + self.world_size:
                return False
            self._connections += 1
            return True

    def _release(self) -> None:
        with self._lock:
            self._connections -= 1

    async def _connection(self, reader: LineConnection, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if not self._admit():
            refuse(peer, "too many connections at once")
            writer.close()
            return
        rank: Optional[int] = None
        relay = False
        try:
            accepted = await accept_hello(reader, writer, peer, self.secret.key, self.rank_limit)
            if accepted is not None:
                rank, relay, welcome = accepted
                self._welcome(rank, relay, writer, welcome)
                if relay:
                    served, now = self._served[writer], self._relayed[writer]
                    await reader.serve(partial(self._relay_line, served, now, writer))
                else:
                    await reader.serve(partial(self._rank_line, rank))
        except OSError as exc:  # a rank died or its host went away
            log_once(
                "coordinator_conn_lost",
                "tf_otel: lost a coordinator connection from %s (%s); roots of the steps "
                "it was in are marked partial",
                peer,
                exc,
            )
        except Exception as exc:  # noqa: BLE001 - a stranger's bytes must not raise
            count("coordinator_conn_error")
            log_once("coordinator_conn", "tf_otel: coordinator connection ended (%s)", exc)
        finally:
            routed = [rank] if rank is not None and not relay else []
            with self._write_lock:
                routed += self._relayed.pop(writer, ())  # a relay's ranks go with it
                self._served.pop(writer, None)
                # not a rank that came back through another route meanwhile (a new relay)
                gone = [lost for lost in routed if self._writers.get(lost) is writer]
                for lost in gone:
                    self._writers.pop(lost, None)
            with self._lock:
                self._finished.update(gone)
            self._release()
            writer.close()

    def _welcome(
        self, rank: int, relay: bool, writer: asyncio.StreamWriter, welcome: bytes
    ) -> None:
        with self._write_lock:  # the welcome, then what was held for it, then live messages
            writer.write(welcome)
            if relay:  # its ranks are routed to it as it names them (JOIN)
                self._relayed[writer], self._served[writer] = set(), set()
                return
        self._route(rank, writer)

    def _route(self, rank: int, writer: asyncio.StreamWriter) -> None:
        """Messages for ``rank`` go through ``writer`` from now: what was held for it first.
        A rank that comes back (its relay died, it reconnected) is no longer finished."""
        with self._write_lock:
            held = self._held.pop(rank, ())
            self._held_bytes.pop(rank, None)
            relay = writer in self._relayed
            for data in held:
                writer.write(messages.wrap(messages.TO, rank, data) if relay else data)
            self._writers[rank] = writer
            peer = writer.get_extra_info("peername")
            if isinstance(peer, (tuple, list)) and peer:
                self._hosts[rank] = str(peer[0])
        with self._lock:
            self._finished.discard(rank)

    def _relay_line(
        self, served: Set[int], now: Set[int], writer: asyncio.StreamWriter, line: bytes
    ) -> bool:
        """A host relay's line (False: it said bye): its ranks come and go, their extents of a
        step in one message, their extension messages wrapped. A rank it did not name is
        refused."""
        message = decode_or_count(line)
        if message is None:
            return True
        kind = message["t"]
        if kind == messages.EXTENTS:  # checked by decode: ints, 0 <= a <= b, bounded
            items = message["e"]
            for item in items:
                if item[0] not in served:
                    count("coordinator_bad_message")  # a rank this relay never served
                    return True
            self.add_many(message["k"], message["s"], items)
        elif kind == messages.JOIN and message["r"] < self.rank_limit:
            with self._write_lock:
                served.add(message["r"])
                now.add(message["r"])
            self._route(message["r"], writer)
        elif kind == messages.LEAVE and message["r"] in served:
            with self._write_lock:
                now.discard(message["r"])
                left = self._writers.get(message["r"]) is writer
                if left:  # not if it came back through another route meanwhile
                    self._writers.pop(message["r"], None)
            if left:
                with self._lock:
                    self._finished.add(message["r"])
        elif kind == messages.VIA and message["r"] in now:
            try:
                inner = messages.check(message["m"])
            except BadMessage:
                inner = None
            if inner is None or inner["t"] in messages.COORDINATOR_TYPES:
                count("coordinator_bad_message")
                return True
            self.handlers.at_reference(message["r"], inner)
        elif kind == messages.BYE:
            return False
        else:  # a rank out of range or not this relay's, or a type a relay never sends
            count("coordinator_bad_message")
        return True

    def _rank_line(self, rank: int, line: bytes) -> bool:
        """A rank's own line (False: it said bye)."""
        message = decode_or_count(line)
        if message is None:
            return True
        kind = message["t"]
        if kind == messages.EXTENT:  # checked by decode: ints, 0 <= a <= b, short key
            self.add(rank, message["k"], message["s"], message["a"], message["b"], message.get("w"))
        elif kind == messages.BYE:
            return False
        elif kind in messages.COORDINATOR_TYPES:
            count("coordinator_bad_message")
        else:
            self.handlers.at_reference(rank, message)
        return True

    def send(self, rank: int, message: Outgoing) -> bool:
        """Send an extension message to one rank (held until it connects); False if lost."""
        return self._send_bytes(rank, encode(message))

    def _send_bytes(self, rank: int, data: bytes, as_is: bool = False) -> bool:
        """``data`` to ``rank`` (wrapped for its relay unless ``as_is``: a broadcast)."""
        with self._write_lock:
            writer = self._writers.get(rank)
            if writer is None:
                if rank in self._finished or not 0 < rank < self.rank_limit:
                    return False
                # not connected yet (it starts its first step later): deliver on its hello
                held = self._held.setdefault(rank, [])
                size = self._held_bytes.get(rank, 0) + len(data)
                if len(held) >= MAX_HELD_MESSAGES or size > MAX_HELD_BYTES:
                    count("coordinator_held_dropped")
                    return False
                held.append(data)
                self._held_bytes[rank] = size
                return True
            if writer.transport.is_closing():
                self._writers.pop(rank, None)
                return False
            if writer.transport.get_write_buffer_size() + len(data) > MAX_UNSENT_BYTES:
                count("coordinator_send_dropped")  # the rank does not read: never unbounded
                return False
            if not as_is and writer in self._relayed:
                data = messages.wrap(messages.TO, rank, data)
        assert self._loop is not None  # a writer exists only once the loop serves
        try:
            self._loop.call_soon_threadsafe(write_open, writer, data)
        except RuntimeError:  # the loop is closed: the aggregator is closing
            return False
        return True

    def broadcast(self, message: Outgoing) -> int:
        """Send to every connected rank (once per connection: a host relay fans it out to its
        ranks); returns how many ranks it went to."""
        data = encode(message)  # once for every rank (a Gather answer goes to each of them)
        with self._write_lock:
            routes: Dict[asyncio.StreamWriter, int] = {}  # a connection -> one rank it serves
            served: Dict[asyncio.StreamWriter, int] = {}
            for rank, writer in self._writers.items():
                routes.setdefault(writer, rank)
                served[writer] = served.get(writer, 0) + 1
        return sum(
            served[writer] for writer, rank in routes.items() if self._send_bytes(rank, data, True)
        )

    def connected_ranks(self) -> set:
        """The ranks reachable now: connected themselves or through their host relay."""
        with self._write_lock:
            return set(self._writers)

    def connection_count(self) -> int:
        """The connections that carry ranks now (a host relay's is one for all its ranks)."""
        with self._write_lock:
            return len(set(self._writers.values()))

    def close(self) -> None:
        self._stop.set()
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return
        with self._write_lock:
            writers = list(set(self._writers.values()) | set(self._relayed))

        def shut() -> None:
            server.close()
            for writer in writers:
                writer.close()
            loop.stop()

        try:
            loop.call_soon_threadsafe(shut)
        except RuntimeError:  # already closed
            pass
