"""Ping-pong transports: TCP to rank 0's clock server, or mpi4py point-to-point.

Wire format (TCP, little endian, no JSON in the hot path): every client frame is 16 bytes
``<B7xQ`` = kind + argument. PING(seq) is answered by 24 bytes ``<QQQ`` = seq, t1, t2 taken with
``tf_otel.clock.now_ns()`` right after the receive and right before the send. HELLO(rank) names
the client; REPORT(length) is followed by ``length`` bytes of JSON (clock-check only, not hot).
Both ends timestamp the same way (receive returns -> read the clock; read the clock -> send), so
the residual asymmetry is small; TCP_NODELAY keeps Nagle out of the RTT.

Each connection opens with a mutual HMAC handshake over the per-job key (job.job_secret),
outside the hot path: the server sends ``MAGIC`` + a 32-byte nonce; the client sends
HELLO(rank) + its 32-byte MAC + its own 32-byte nonce; the server answers with its 32-byte MAC.
A peer without the key is refused and counted (``clock_refused``); a client whose server cannot
prove the key (a process squatting on the port) fails the round with OSError.

Usage::

    server = TcpServer("127.0.0.1", port); server.start()      # rank 0
    client = TcpClient("127.0.0.1", port, rank=1); client.connect(timeout=2.0)
    exchanges = client.exchange(64, timeout=1.0)                 # [Exchange, ...]
"""

from __future__ import annotations

import json
import select
import socket
import struct
import threading
import time
from typing import Any, Dict, List, Optional

from tf_otel import clock
from tf_otel.clock.estimate import Exchange
from tf_otel.health import count, log_once
from tf_otel.job import job_secret
from tf_otel.job.topology import resolve_address

FRAME = struct.Struct("<B7xQ")
REPLY = struct.Struct("<QQQ")
HEAD = struct.Struct("<QQ")  # seq, t1 of a reply
STAMP = struct.Struct("<Q")  # t2 of a reply
PING, HELLO, REPORT = 1, 2, 3
MAX_REPORT = 1 << 20
MAGIC = b"TFOTELC1"
SERVICE = "clock"
HANDSHAKE_TIMEOUT_S = 5.0
MAX_HANDSHAKES = 64  # connections mid-handshake at once; the next wait in the listen backlog
BACKLOG = 4096  # every rank may connect at once (the kernel caps it at net.core.somaxconn)
MAX_RANK = 1 << 24
HELLO_BYTES = FRAME.size + job_secret.MAC_BYTES + job_secret.NONCE_BYTES  # frame, MAC, nonce
RECV_BYTES = 1 << 16  # read at most this much of a connection at a time
MAX_REPORTS = 1 << 16

# MPI tags (on COMM_WORLD: point-to-point only, so no collective call is needed to set up)
TAG_PING, TAG_PONG, TAG_REPORT = 0x7C10, 0x7C11, 0x7C12


def _recv_exact(sock: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


class _Peer:
    """One connection of the clock service: its handshake, then its frames."""

    __slots__ = ("sock", "buffer", "nonce", "deadline", "rank")

    def __init__(self, sock: socket.socket, nonce: bytes, deadline: float) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.nonce = nonce  # the challenge's: the hello's MAC must cover it
        self.deadline = deadline  # the hello is due by then
        self.rank = 0  # 0 while handshaking; the rank it proved afterwards


class TcpServer:
    """Rank 0's clock service: ONE daemon thread serves every connection from epoll (no
    thread per rank: at 511 host leaders warming up at once, a thread per connection cost
    ~25-50 us of CPU a ping in thread switches, and the handshakes starved). A ping is answered
    as soon as its frame is read. At most MAX_HANDSHAKES handshakes run at once (a silent
    stranger holds one for HANDSHAKE_TIMEOUT_S); the rest wait in the listen backlog rather than
    be refused: at start-up every rank of the job connects within the same second."""

    def __init__(self, host: str, port: int, secret: Optional[job_secret.JobKey] = None) -> None:
        self.host, self.port = host, port
        self.secret = secret or job_secret.job_key()
        self._handshaking = 0
        self._conns_lock = threading.Lock()
        self.reports: Dict[int, Dict[str, Any]] = {}
        self._reports_changed = threading.Condition()
        self._sock: Optional[socket.socket] = None
        self._conns: Dict[socket.socket, _Peer] = {}  # live connections only (bounded)
        # epoll (Linux), else poll: the same calls, poll's timeout in ms
        self._poll: Any = select.epoll() if hasattr(select, "epoll") else select.poll()
        self._tick = 1.0 if hasattr(select, "epoll") else 1000  # the expiry sweep's period
        # fd -> its peer (the listener and the wake-up socket are not in it)
        self._by_fd: Dict[int, _Peer] = {}
        self._wake_r, self._wake_w = socket.socketpair()  # close() wakes the loop
        self._accepting = False
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self.bytes_in = 0
        self.bytes_out = 0

    @property
    def connections(self) -> int:
        """Ranks connected now (handshaking or served)."""
        with self._conns_lock:
            return len(self._conns)

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
            sock.listen(BACKLOG)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self._sock = sock
        job_secret.warn_if_weak(self.secret, self.host, "clock service")
        self._wake_r.setblocking(False)
        self._poll.register(self._wake_r.fileno(), select.POLLIN)
        self._accept_more(True)
        self._thread = threading.Thread(target=self._loop, name="tf_otel-clock-server", daemon=True)
        self._thread.start()

    def _accept_more(self, on: bool) -> None:
        """Watch the listening socket, or not (MAX_HANDSHAKES running: the rest wait queued)."""
        if on != self._accepting and self._sock is not None:
            if on:
                self._poll.register(self._sock.fileno(), select.POLLIN)
            else:
                self._poll.unregister(self._sock.fileno())
            self._accepting = on

    def _loop(self) -> None:
        assert self._sock is not None
        listener, wake, by_fd = self._sock.fileno(), self._wake_r.fileno(), self._by_fd
        try:
            while not self._closed:
                events = self._poll.poll(self._tick if self._handshaking else -1)
                for fd, _ in events:
                    peer = by_fd.get(fd)
                    if peer is not None:
                        self._readable(peer)
                    elif fd == listener:
                        self._accept()
                    elif fd == wake:  # close() woke the loop
                        return
                if self._handshaking:
                    self._expire(time.monotonic())
        except Exception as exc:  # noqa: BLE001 - the service ends, training never does
            log_once("clock:server", "tf_otel: clock service stopped (%s)", exc)
        finally:
            with self._conns_lock:
                peers = list(self._conns.values())
                self._conns.clear()
            for peer in peers:
                peer.sock.close()
            if self._sock is not None:
                self._sock.close()
            getattr(self._poll, "close", lambda: None)()
            self._wake_r.close()

    def _accept(self) -> None:
        assert self._sock is not None
        while self._handshaking < MAX_HANDSHAKES:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. out of descriptors: try again on the next readiness
                count("clock.server.conn_error")
                return
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = job_secret.nonce()
            peer = _Peer(conn, nonce, time.monotonic() + HANDSHAKE_TIMEOUT_S)
            try:
                if conn.send(MAGIC + nonce) != len(MAGIC) + len(nonce):
                    raise OSError("the challenge did not fit the socket's buffer")
            except OSError:
                _refuse("no hello in time")
                conn.close()
                continue
            self._handshaking += 1
            with self._conns_lock:
                self._conns[conn] = peer
            self._by_fd[conn.fileno()] = peer
            self._poll.register(conn.fileno(), select.POLLIN)
        self._accept_more(False)

    def _expire(self, now: float) -> None:
        """Handshakes past HANDSHAKE_TIMEOUT_S: refused (a silent stranger keeps no seat)."""
        with self._conns_lock:
            late = [p for p in self._conns.values() if not p.rank and now > p.deadline]
        for peer in late:
            _refuse("no hello in time")
            self._drop(peer)

    def _drop(self, peer: _Peer) -> None:
        with self._conns_lock:
            if self._conns.pop(peer.sock, None) is None:
                return
        if not peer.rank:
            self._handshaking -= 1
            self._accept_more(True)
        fd = peer.sock.fileno()
        self._by_fd.pop(fd, None)
        try:
            self._poll.unregister(fd)
        except (OSError, ValueError, KeyError):
            pass
        peer.sock.close()

    def _readable(self, peer: _Peer) -> None:
        try:
            data = peer.sock.recv(RECV_BYTES)
            t1 = clock.now_ns()  # a ping's receive time: right after its frame arrived
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if not peer.rank:
                _refuse("no hello in time")
            else:
                self._lost(exc)
            self._drop(peer)
            return
        if not data:  # the peer closed
            if not peer.rank:
                _refuse("closed during the handshake")
            self._drop(peer)
            return
        if not peer.buffer and len(data) == FRAME.size and peer.rank and data[0] == PING:
            # the hot path: one ping alone, as a round's back-to-back exchanges come
            try:
                self._pong(peer, FRAME.unpack(data)[1], t1)
                return
            except OSError as exc:
                self._lost(exc)
                self._drop(peer)
                return
        peer.buffer += data
        try:
            if not peer.rank and not self._hello(peer):
                self._drop(peer)
                return
            if peer.rank and not self._frames(peer, t1):
                self._drop(peer)
        except Exception as exc:  # noqa: BLE001 - a peer's bytes end its connection only
            self._lost(exc)
            self._drop(peer)

    def _lost(self, exc: BaseException) -> None:
        if not self._closed:
            count("clock.server.conn_error")
            log_once("clock:server_conn", "tf_otel: clock service connection lost (%s)", exc)

    def _hello(self, peer: _Peer) -> bool:
        """The hello, once whole: True when the peer proved the job key (proof sent back), or
        while it is still coming; False: refused."""
        if len(peer.buffer) < HELLO_BYTES:
            return True
        hello = bytes(peer.buffer[:HELLO_BYTES])
        del peer.buffer[:HELLO_BYTES]
        kind, rank = FRAME.unpack_from(hello)
        mac = hello[FRAME.size : FRAME.size + job_secret.MAC_BYTES]
        client_nonce = hello[FRAME.size + job_secret.MAC_BYTES :]
        if kind != HELLO or not 0 < rank < MAX_RANK:
            _refuse("no hello")
            return False
        expected = job_secret.client_mac(self.secret.key, SERVICE, peer.nonce, rank)
        if not job_secret.check(expected, mac):
            _refuse(f"wrong credentials for rank {rank}")
            return False
        proof = job_secret.server_mac(self.secret.key, SERVICE, client_nonce, rank)
        if peer.sock.send(proof) != len(proof):
            return False
        peer.rank = int(rank)
        self._handshaking -= 1
        self._accept_more(True)
        return True

    def _frames(self, peer: _Peer, t1: int) -> bool:
        """Answer the whole frames read; False: the connection ends (a bad frame, a rank that
        does not read its replies)."""
        buffer = peer.buffer
        while len(buffer) >= FRAME.size:
            kind, arg = FRAME.unpack_from(buffer)
            if kind == PING:
                del buffer[: FRAME.size]
                self._pong(peer, arg, t1)
                t1 = clock.now_ns()  # a later frame of the same read
            elif kind == REPORT and 0 < arg <= MAX_REPORT:
                if len(buffer) < FRAME.size + arg:
                    return True  # the rest of the report is still coming
                payload = bytes(buffer[FRAME.size : FRAME.size + arg])
                del buffer[: FRAME.size + arg]
                report = json.loads(payload.decode())
                if not isinstance(report, dict):
                    raise ValueError("a clock report is not a JSON object")
                with self._reports_changed:
                    if peer.rank in self.reports or len(self.reports) < MAX_REPORTS:
                        self.reports[peer.rank] = report
                    self._reports_changed.notify_all()
            else:
                count("clock.server.bad_frame")
                return False
        return True

    def _pong(self, peer: _Peer, arg: int, t1: int) -> None:
        """Answer a ping received at ``t1``; OSError: the rank does not read its replies."""
        self.bytes_in += FRAME.size
        self.bytes_out += REPLY.size
        reply = HEAD.pack(arg, t1) + STAMP.pack(clock.now_ns())  # t2: as late as possible
        if peer.sock.send(reply) != REPLY.size:
            raise OSError("a rank does not read its clock replies")

    def wait_reports(self, n: int, timeout: float) -> Dict[int, Dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self._reports_changed:
            while len(self.reports) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._reports_changed.wait(left)
            return dict(self.reports)

    def close(self) -> None:
        """Stop serving: the loop closes every connection and the listening socket."""
        if self._closed:
            return
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        elif self._thread is None:  # never started
            if self._sock is not None:
                self._sock.close()
            getattr(self._poll, "close", lambda: None)()
            self._wake_r.close()
        self._wake_w.close()


class TcpClient:
    """A rank's connection to the clock service."""

    def __init__(
        self, host: str, port: int, rank: int, secret: Optional[job_secret.JobKey] = None
    ) -> None:
        self.host, self.port, self.rank = host, port, rank
        self.secret = secret or job_secret.job_key()
        self._sock: Optional[socket.socket] = None
        self.bytes_out = 0
        self.bytes_in = 0

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self, timeout: float) -> None:
        """Connect and run the handshake; OSError if the server is absent or not this job's."""
        sock = socket.create_connection(resolve_address((self.host, self.port)), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            challenge = bytearray(len(MAGIC) + job_secret.NONCE_BYTES)
            if not _recv_exact(sock, memoryview(challenge)) or challenge[: len(MAGIC)] != MAGIC:
                raise OSError("the process on the clock port is not a tf_otel clock service")
            key, client_nonce = self.secret.key, job_secret.nonce()
            server_nonce = bytes(challenge[len(MAGIC) :])
            mac = job_secret.client_mac(key, SERVICE, server_nonce, self.rank)
            sock.sendall(FRAME.pack(HELLO, self.rank) + mac + client_nonce)
            proof = bytearray(job_secret.MAC_BYTES)
            if not _recv_exact(sock, memoryview(proof)):
                raise OSError("the clock service refused this rank's credentials (job secret)")
            expected = job_secret.server_mac(key, SERVICE, client_nonce, self.rank)
            if not job_secret.check(expected, bytes(proof)):
                raise OSError("the clock service could not prove the job secret")
        except OSError:
            sock.close()
            raise
        self._sock = sock

    def exchange(self, n: int, timeout: float) -> List[Exchange]:
        """``n`` back-to-back ping-pongs; raises OSError (and disconnects) on failure."""
        sock = self._sock
        if sock is None:
            raise OSError("not connected")
        now_ns = clock.now_ns
        sock.settimeout(timeout)
        reply = bytearray(REPLY.size)
        view = memoryview(reply)
        frames = [FRAME.pack(PING, seq) for seq in range(n)]
        out: List[Exchange] = []
        try:
            for seq in range(n):
                t0 = now_ns()
                sock.sendall(frames[seq])
                if not _recv_exact(sock, view):
                    raise OSError("clock service closed the connection")
                t3 = now_ns()
                got, t1, t2 = REPLY.unpack_from(reply)
                if got != seq:
                    raise OSError("clock service replied out of order")
                out.append(Exchange(t0, t1, t2, t3))
        except OSError:
            self.close()
            raise
        finally:
            self.bytes_out += FRAME.size * len(out)
            self.bytes_in += REPLY.size * len(out)
        return out

    def send_report(self, report: Dict[str, Any], timeout: float) -> None:
        if self._sock is None:
            raise OSError("not connected")
        payload = json.dumps(report).encode()
        self._sock.settimeout(timeout)
        self._sock.sendall(FRAME.pack(REPORT, len(payload)) + payload)

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None


def _refuse(why: str) -> None:
    log_once(  # counts "clock_refused" every time, logs the first
        "clock_refused",
        "tf_otel: clock service refused a connection (%s); every rank must hold the same job "
        "secret (TF_OTEL_JOB_SECRET)",
        why,
    )


def mpi_ready() -> Any:
    """mpi4py's MPI module when the process already uses MPI with threads; else None.

    Never imports mpi4py.MPI itself (that would initialise MPI under a non-MPI launcher).
    """
    import sys

    mod = sys.modules.get("mpi4py.MPI")
    if mod is None:
        return None
    try:
        if not mod.Is_initialized() or mod.Is_finalized():
            return None
        if mod.Query_thread() != mod.THREAD_MULTIPLE:
            log_once(
                "clock:mpi_thread",
                "tf_otel: MPI is not initialised with MPI_THREAD_MULTIPLE; clock sync uses TCP",
            )
            return None
    except Exception:  # noqa: BLE001 - a broken MPI must not break training
        return None
    return mod


class MpiServer:
    """Rank 0's clock service over MPI point-to-point on COMM_WORLD with dedicated tags.

    A daemon thread polls a pending receive: hot (spinning) for 50 ms after each ping so a round's
    back-to-back exchanges are answered at once, sleeping 2 ms between polls when idle (MPI's own
    blocking receive would spin a core forever).
    """

    HOT_S = 0.05
    IDLE_SLEEP_S = 0.002

    def __init__(self, mpi: Any) -> None:
        self.mpi = mpi
        self.comm = mpi.COMM_WORLD
        self.reports: Dict[int, Dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.bytes_in = 0
        self.bytes_out = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="tf_otel-clock-mpi", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        mpi, comm, now_ns = self.mpi, self.comm, clock.now_ns
        frame = bytearray(FRAME.size)
        reply = bytearray(REPLY.size)
        status = mpi.Status()
        req = comm.Irecv(frame, source=mpi.ANY_SOURCE, tag=TAG_PING)
        hot_until = 0.0
        try:
            while not self._stop.is_set():
                if req.Test(status):
                    t1 = now_ns()
                    _, seq = FRAME.unpack_from(frame)
                    source = status.Get_source()
                    HEAD.pack_into(reply, 0, seq, t1)
                    STAMP.pack_into(reply, 16, now_ns())  # t2
                    comm.Send(reply, dest=source, tag=TAG_PONG)
                    self.bytes_in += FRAME.size
                    self.bytes_out += REPLY.size
                    req = comm.Irecv(frame, source=mpi.ANY_SOURCE, tag=TAG_PING)
                    hot_until = time.monotonic() + self.HOT_S
                    continue
                if comm.Iprobe(source=mpi.ANY_SOURCE, tag=TAG_REPORT, status=status):
                    source = status.Get_source()
                    self.reports[source] = comm.recv(source=source, tag=TAG_REPORT)
                    continue
                if time.monotonic() > hot_until:
                    time.sleep(self.IDLE_SLEEP_S)
        finally:
            try:
                req.Cancel()
                req.Wait()
            except Exception:  # noqa: BLE001
                pass

    def wait_reports(self, n: int, timeout: float) -> Dict[int, Dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.reports) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return dict(self.reports)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


class MpiClient:
    """A rank's ping-pong to rank 0 over MPI (polls with a deadline, so a dead rank 0 times out)."""

    def __init__(self, mpi: Any, rank: int) -> None:
        self.mpi = mpi
        self.comm = mpi.COMM_WORLD
        self.rank = rank
        self.bytes_out = 0
        self.bytes_in = 0

    @property
    def connected(self) -> bool:
        return True

    def connect(self, timeout: float) -> None:
        return None

    def exchange(self, n: int, timeout: float) -> List[Exchange]:
        comm, now_ns = self.comm, clock.now_ns
        frames = [FRAME.pack(PING, seq) for seq in range(n)]
        reply = bytearray(REPLY.size)
        out: List[Exchange] = []
        deadline = time.monotonic() + timeout * max(1, n // 8)
        for seq in range(n):
            req = comm.Irecv(reply, source=0, tag=TAG_PONG)
            t0 = now_ns()
            comm.Send(frames[seq], dest=0, tag=TAG_PING)
            while not req.Test():
                if time.monotonic() > deadline:
                    req.Cancel()
                    req.Wait()
                    raise OSError("rank 0 did not answer the clock ping over MPI")
            t3 = now_ns()
            got, t1, t2 = REPLY.unpack_from(reply)
            if got != seq:
                raise OSError("clock service replied out of order")
            out.append(Exchange(t0, t1, t2, t3))
        self.bytes_out += FRAME.size * len(out)
        self.bytes_in += REPLY.size * len(out)
        return out

    def send_report(self, report: Dict[str, Any], timeout: float) -> None:
        self.comm.send(report, dest=0, tag=TAG_REPORT)

    def close(self) -> None:
        return None
