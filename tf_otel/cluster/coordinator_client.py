"""A rank's link to rank 0's coordinator (cluster/coordinator.py): one TCP connection, the
mutual HMAC handshake, then step extents and extension messages out and rank 0's messages in.

Usage (done by cluster.services)::

    client = CoordinatorClient(address, rank, handlers=handlers)
    client.report(key, step, start_ns, end_ns, wait_ns)    # never blocks: a bounded queue
    client.send(message)                                   # an extension message
    client.close(timeout_s)                                # send what is queued, say bye

A daemon thread connects (retrying with jittered back-off while the job runs: at start-up a
thousand ranks reach rank 0 at once) and sends; another reads rank 0's messages for the handlers.

With a ``route`` (cluster/host_relay.py) each try asks it where to connect: the host relay, or
rank 0; a connection that ends is then made again (the relay died: the next leader's relay, or
rank 0), the message whose send failed sent again on it. A relay's own link to rank 0 is a client
with ``relay=True`` (its hello says so) and ``on_line`` (rank 0's lines, raw, for its fan-out).
"""

from __future__ import annotations

import queue
import random
import socket
import threading
import time
from typing import Any, Callable, Optional, Tuple

from tf_otel.cluster import messages
from tf_otel.cluster.coordinator import MAX_LINE
from tf_otel.cluster.framing import decode_or_count
from tf_otel.cluster.handshake import HANDSHAKE_TIMEOUT_S, RELAY_SERVICE, SERVICE, parse_hex
from tf_otel.cluster.messages import BadMessage, Handlers, Message, Outgoing, decode, encode
from tf_otel.health import count, log_once
from tf_otel.job import job_secret
from tf_otel.job.topology import resolve_address

MAX_CLIENT_LINE = 32 << 20  # from rank 0: per-rank Horovod records (bounded by their sender)
RETRY_MAX_DELAY_S = 5.0  # the back-off between tries to reach rank 0 (tries never stop)
Route = Callable[[], Tuple[str, int]]  # where to connect now (a host relay, or rank 0)


class _Lost:
    """Queued by a reader whose connection ended: the sender connects again (with a route)."""

    def __init__(self, generation: int) -> None:
        self.generation = generation


def _handshake_line(rfile: Any) -> Optional[Message]:
    """rank 0's next handshake message, or None (not counted: the caller says why it failed)."""
    try:
        return decode(rfile.readline(MAX_LINE))
    except BadMessage:
        return None


class CoordinatorClient:
    """A rank's link to rank 0; reports go through a bounded queue, sent by a daemon thread."""

    STILL_TRYING_S = 60.0  # logged once when rank 0 has not answered for this long

    def __init__(
        self,
        address: Tuple[str, int],
        rank: int,
        max_queue: int = 4096,
        secret: Optional[job_secret.JobKey] = None,
        handlers: Optional[Handlers] = None,
        route: Optional[Route] = None,
        relay: bool = False,
        on_line: Optional[Callable[[bytes], None]] = None,
    ) -> None:
        self.address = address
        self.handlers = handlers or Handlers()  # extension messages from rank 0
        self.rank = rank
        self.secret = secret or job_secret.job_key()
        self.route = route  # None: always rank 0 at ``address``, one connection
        self.relay = relay  # this is a host relay's link to rank 0
        self.on_line = on_line  # rank 0's lines, raw (a relay's), instead of the handlers
        self.connected_to: Optional[Tuple[str, int]] = None  # the peer now (tests, benches)
        self._generation = 0  # of the connection: a reader of an old one is not heard
        self._queue: queue.Queue[Any] = queue.Queue(max_queue)  # bytes, None (bye) or _Lost
        self._closing = threading.Event()  # set by close(): stop trying to connect
        self._thread = threading.Thread(target=self._run, name="tf_otel-coord-client", daemon=True)
        self._thread.start()

    def report(
        self, key: str, step: int, start_ns: int, end_ns: int, wait_ns: Optional[int] = None
    ) -> None:
        self.send(messages.extent(key, step, start_ns, end_ns, wait_ns))

    def send(self, message: Outgoing) -> None:
        """Queue a message for rank 0 (never blocks; dropped and counted when the queue is full)."""
        self.send_bytes(encode(message))

    def send_bytes(self, data: bytes) -> None:
        """Queue an encoded line (a relay forwards its ranks' lines without encoding them)."""
        try:
            self._queue.put_nowait(data)
        except queue.Full:
            count("coordinator_dropped")

    def close(self, timeout_s: float) -> None:
        """Send what is queued and say bye, waiting up to timeout_s (still connecting: it may
        yet connect within it); then stop trying."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            self._closing.set()
            return
        self._thread.join(timeout_s)
        self._closing.set()

    def _handshake(self, sock: socket.socket) -> Tuple[Any, str]:
        """(the connection's read file, "") once both sides proved the key; (None, why) if not."""
        rfile = sock.makefile("rb")
        challenge = _handshake_line(rfile)
        server_nonce = parse_hex((challenge or {}).get("n"), job_secret.NONCE_BYTES)
        if challenge is None or challenge["t"] != messages.CHALLENGE or server_nonce is None:
            return None, "it sent no tf_otel challenge"
        key, client_nonce = self.secret.key, job_secret.nonce()
        service = RELAY_SERVICE if self.relay else SERVICE
        mac = job_secret.client_mac(key, service, server_nonce, self.rank)
        hello = {"t": messages.HELLO, "rank": self.rank, "mac": mac.hex(), "cn": client_nonce.hex()}
        if self.relay:
            hello["relay"] = 1
        sock.sendall(encode(hello))
        welcome = _handshake_line(rfile)
        if welcome is None:
            return None, "it refused this rank's credentials"
        proof = parse_hex(welcome.get("mac"), job_secret.MAC_BYTES)
        expected = job_secret.server_mac(key, service, client_nonce, self.rank)
        proven = proof is not None and job_secret.check(expected, proof)
        if welcome["t"] != messages.WELCOME or not proven:
            return None, "it could not prove the job secret"
        return rfile, ""

    def _connect(self) -> Tuple[Optional[socket.socket], Any]:
        """Connect and prove the key, trying until it works or the rank closes: at start-up a
        thousand ranks reach rank 0 at once, and one given up on would be missing from every
        root. Back-off with jitter up to RETRY_MAX_DELAY_S; reports queue (bounded) meanwhile."""
        delay = 0.05
        began = time.monotonic()
        logged = False
        while not self._closing.is_set():
            why = "no answer"
            try:
                address = resolve_address(self._where())  # Horovod multi-host: a lookup
                sock = socket.create_connection(address, timeout=HANDSHAKE_TIMEOUT_S)
            except OSError as exc:  # rank 0 not listening yet, or its backlog is full
                sock, why = None, f"no connection ({exc or type(exc).__name__})"
            if sock is not None:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    rfile, why = self._handshake(sock)
                except OSError as exc:  # includes the handshake's timeout
                    rfile, why = None, f"no handshake ({exc or type(exc).__name__})"
                if rfile is not None:
                    sock.settimeout(None)
                    self.connected_to = address
                    return sock, rfile
                sock.close()
                count("coordinator_handshake_failed")
            if not logged and time.monotonic() - began > self.STILL_TRYING_S:
                logged = True
                log_once(
                    "coordinator_connect",
                    "tf_otel: cannot reach rank 0's coordinator at %s:%s (%s); still trying. "
                    "Until it answers, this rank's spans may fall outside their step root. Set "
                    "TF_OTEL_COORDINATOR=host:port of rank 0 and the same TF_OTEL_JOB_SECRET on "
                    "every rank",
                    self.address[0],
                    self.address[1],
                    why,
                )
            self._closing.wait(delay * random.uniform(0.5, 1.0))  # jitter: ranks spread out
            delay = min(delay * 2, RETRY_MAX_DELAY_S)
        return None, None

    def _where(self) -> Tuple[str, int]:
        """Where to connect on this try: the route's answer, or rank 0 (the route failed)."""
        if self.route is None:
            return self.address
        try:
            return self.route()
        except OSError:  # rank 0 unreachable (not published yet): this try fails, backs off
            raise
        except Exception as exc:  # noqa: BLE001 - a broken route must not stop the reports
            log_once("coordinator_route", "tf_otel: host relay route failed (%s)", exc)
            return self.address

    def _read(self, rfile: Any, generation: int) -> None:
        try:
            while True:
                line = rfile.readline(MAX_CLIENT_LINE)
                if not line or not line.endswith(b"\n"):
                    if len(line) >= MAX_CLIENT_LINE:
                        count("coordinator_bad_message")
                    break
                if self.on_line is not None:
                    try:
                        self.on_line(line)
                    except Exception as exc:  # noqa: BLE001 - the link must keep reading
                        log_once("coordinator_on_line", "tf_otel: relay fan-out failed (%s)", exc)
                    continue
                message = decode_or_count(line)
                if message is not None:
                    self.handlers.at_rank(message)
        except (OSError, ValueError):
            pass
        if self.route is not None:  # connect again now: rank 0's questions come this way too
            try:
                self._queue.put_nowait(_Lost(generation))
            except queue.Full:  # the next send fails and connects again
                pass

    def _open(self) -> Optional[socket.socket]:
        """A connection (trying until the rank closes) with its reader thread."""
        sock, rfile = self._connect()
        if sock is not None:
            self._generation += 1
            threading.Thread(
                target=self._read,
                args=(rfile, self._generation),
                name="tf_otel-coord-reader",
                daemon=True,
            ).start()
        return sock

    def _run(self) -> None:
        sock = self._open()
        while True:
            item = self._queue.get()
            if isinstance(item, _Lost):  # its connection ended: another (a relay died)
                if sock is not None and item.generation == self._generation:
                    count("coordinator_reconnect")
                    sock.close()
                    sock = self._open()
                continue
            if sock is None and self.route is not None and not self._closing.is_set():
                sock = self._open()  # lost twice at once before: try the route again
            if sock is None:
                if item is None:
                    return
                count("coordinator_dropped")
                continue
            data = item if item is not None else encode({"t": messages.BYE})
            try:
                sock.sendall(data)
            except OSError as exc:
                sock.close()
                sock = None
                if self.route is not None and not self._closing.is_set():
                    count("coordinator_reconnect")
                    sock = self._open()  # the host's next relay, or rank 0: this line again
                    sock = self._send_again(sock, data)
                else:
                    log_once("coordinator_send", "tf_otel: lost connection to rank 0 (%s)", exc)
            if item is None:
                if sock is not None:
                    sock.close()
                return

    def _send_again(self, sock: Optional[socket.socket], data: bytes) -> Optional[socket.socket]:
        if sock is None:
            return None
        try:
            sock.sendall(data)
            return sock
        except OSError as exc:  # a second loss at once: the next item connects again
            log_once("coordinator_send", "tf_otel: lost connection to rank 0 (%s)", exc)
            count("coordinator_dropped")
            sock.close()
            return None
