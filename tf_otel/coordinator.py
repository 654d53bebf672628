"""Rank 0's small TCP service: ranks report each sampled step's extent (in reference time), rank 0
emits the step's root span once every rank has reported, so the root covers all ranks.

Newline-delimited JSON over one TCP connection per rank; never touched by the training thread.

Usage (done by tracing.Pipeline)::

    server = StepAggregator(world_size, wait_s, emit_root); server.serve(("127.0.0.1", port))
    client = CoordinatorClient(address, rank); client.report(key, step, start_ns, end_ns)
"""

from __future__ import annotations

import json
import queue
import socket
import socketserver
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, Optional, Tuple

from tf_otel.health import count, log_once

# emit_root(key, step, start_ns, end_ns, ranks_reported)
EmitRoot = Callable[[str, int, int, int, int], None]
MAX_PENDING_STEPS = 1024
ROOT_MARGIN_NS = 1000
MAX_HELD_MESSAGES = 1024
MAX_EMITTED_STEPS = 8192
LEARN_STEPS = 3

# Extension messages (JSON objects with a "t" type): handlers run on coordinator threads.
# rank 0 receives from a rank: server_handlers[type](rank, message)
server_handlers: Dict[str, Callable[[int, Dict[str, Any]], None]] = {}
# a rank receives from rank 0: client_handlers[type](message)
client_handlers: Dict[str, Callable[[Dict[str, Any]], None]] = {}


def _dispatch(handler: Optional[Callable], *args: Any) -> None:
    if handler is None:
        count("coordinator_unhandled")
        return
    try:
        handler(*args)
    except Exception as exc:  # noqa: BLE001
        log_once("coordinator_handler", "tf_otel: coordinator message handler failed (%s)", exc)


class StepAggregator:
    """Collects per-rank step extents; emits one root per (key, step)."""

    def __init__(self, world_size: int, wait_s: float, emit_root: EmitRoot) -> None:
        self.world_size = world_size
        self.wait_s = wait_s
        self.emit_root = emit_root
        self._pending: OrderedDict[Tuple[str, int], Dict] = OrderedDict()
        self._lock = threading.Lock()
        self._server: Optional[socketserver.ThreadingTCPServer] = None
        self._finished: set = set()  # ranks that said bye or dropped their connection
        self._writers: Dict[int, Any] = {}  # rank -> its connection's write file
        self._held: Dict[int, list] = {}  # rank -> messages sent before it connected
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._emitted: OrderedDict[Tuple[str, int], None] = OrderedDict()  # bounded
        self._reporters: set = set()  # ranks that have reported any step
        self._reaper = threading.Thread(target=self._reap_loop, name="tf_otel-roots", daemon=True)
        self._reaper.start()

    def expected_ranks(self) -> int:
        """How many reports complete a step: every stepping rank at first; once a few steps are
        out, the ranks that actually report (TF2 ParameterServerStrategy workers never do)."""
        if len(self._emitted) < LEARN_STEPS:
            return self.world_size
        return max(1, min(self.world_size, len(self._reporters)))

    def add(self, rank: int, key: str, step: int, start_ns: int, end_ns: int) -> None:
        ready = None
        with self._lock:
            if (key, step) in self._emitted:
                count("roots_late_extent")  # its root is out: a second one would split the step
                return
            self._reporters.add(rank)
            entry = self._pending.get((key, step))
            if entry is None:
                entry = {"start": start_ns, "end": end_ns, "ranks": set(), "t": time.monotonic()}
                self._pending[(key, step)] = entry
                while len(self._pending) > MAX_PENDING_STEPS:
                    old_key, old = self._pending.popitem(last=False)
                    count("roots_forced")
                    self._emit(old_key, old)
            entry["start"] = min(entry["start"], start_ns)
            entry["end"] = max(entry["end"], end_ns)
            entry["ranks"].add(rank)
            if len(entry["ranks"]) >= self.expected_ranks():
                ready = self._pending.pop((key, step))
        if ready is not None:
            self._emit((key, step), ready)

    def _emit(self, key_step: Tuple[str, int], entry: Dict) -> None:
        self._emitted[key_step] = None
        while len(self._emitted) > MAX_EMITTED_STEPS:
            self._emitted.popitem(last=False)
        try:
            # 1 us of margin: backends that keep microseconds must still see children inside
            start, end = entry["start"] - ROOT_MARGIN_NS, entry["end"] + ROOT_MARGIN_NS
            self.emit_root(key_step[0], key_step[1], start, end, len(entry["ranks"]))
        except Exception as exc:  # noqa: BLE001
            log_once("emit_root", "tf_otel: cannot emit step root span (%s)", exc)

    def flush(self, timeout_s: float) -> None:
        """Wait up to timeout_s for outstanding ranks, then emit what is pending."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending or len(self._finished) >= self.world_size - 1:
                    break
            time.sleep(0.02)
        with self._lock:
            pending, self._pending = self._pending, OrderedDict()
        for key_step, entry in pending.items():
            if len(entry["ranks"]) < self.world_size:
                count("roots_partial")
            self._emit(key_step, entry)

    def _reap_loop(self) -> None:
        while not self._stop.wait(0.2):
            now = time.monotonic()
            late = []
            with self._lock:
                for key_step, entry in list(self._pending.items()):
                    if now - entry["t"] > self.wait_s:
                        late.append((key_step, self._pending.pop(key_step)))
            for key_step, entry in late:
                count("roots_partial")
                self._emit(key_step, entry)

    def serve(self, address: Tuple[str, int]) -> bool:
        aggregator = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                rank = -1
                for line in self.rfile:
                    try:
                        message = json.loads(line)
                    except ValueError:
                        count("coordinator_bad_message")
                        continue
                    kind = message.get("t")
                    if kind == "hello":
                        rank = int(message["rank"])
                        with aggregator._write_lock:
                            aggregator._writers[rank] = self.wfile
                            for data in aggregator._held.pop(rank, ()):
                                self.wfile.write(data)
                            self.wfile.flush()
                    elif kind == "extent":
                        aggregator.add(rank, message["k"], message["s"], message["a"], message["b"])
                    elif kind == "bye":
                        break
                    else:
                        _dispatch(server_handlers.get(kind), rank, message)
                with aggregator._write_lock:
                    aggregator._writers.pop(rank, None)
                aggregator._finished.add(rank)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        try:
            self._server = Server(address, Handler)
        except OSError as exc:
            log_once(
                "coordinator_bind",
                "tf_otel: cannot listen on %s:%s (%s); step roots will cover rank 0 only. "
                "Set TF_OTEL_COORDINATOR=host:port to a free port",
                address[0],
                address[1],
                exc,
            )
            return False
        threading.Thread(
            target=self._server.serve_forever, name="tf_otel-coordinator", daemon=True
        ).start()
        return True

    def send(self, rank: int, message: Dict[str, Any]) -> bool:
        """Send an extension message to one rank (held until it connects); False if lost."""
        data = json.dumps(message).encode() + b"\n"
        with self._write_lock:
            writer = self._writers.get(rank)
            if writer is None:
                if rank in self._finished or not 0 < rank < self.world_size:
                    return False
                # not connected yet (it starts its first step later): deliver on its hello
                held = self._held.setdefault(rank, [])
                if len(held) >= MAX_HELD_MESSAGES:
                    count("coordinator_held_dropped")
                    return False
                held.append(data)
                return True
            try:
                writer.write(data)
                writer.flush()
                return True
            except OSError:
                self._writers.pop(rank, None)
                return False

    def broadcast(self, message: Dict[str, Any]) -> int:
        """Send to every connected rank; returns how many got it."""
        with self._write_lock:
            ranks = list(self._writers)
        return sum(self.send(rank, message) for rank in ranks)

    def connected_ranks(self) -> set:
        with self._write_lock:
            return set(self._writers)

    def close(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class CoordinatorClient:
    """A rank's link to rank 0; reports go through a bounded queue, sent by a daemon thread."""

    def __init__(self, address: Tuple[str, int], rank: int, max_queue: int = 4096) -> None:
        self.address = address
        self.rank = rank
        self._queue: queue.Queue[Optional[bytes]] = queue.Queue(max_queue)
        self._thread = threading.Thread(target=self._run, name="tf_otel-coord-client", daemon=True)
        self._thread.start()

    def report(self, key: str, step: int, start_ns: int, end_ns: int) -> None:
        self.send({"t": "extent", "k": key, "s": step, "a": start_ns, "b": end_ns})

    def send(self, message: Dict[str, Any]) -> None:
        """Queue a message for rank 0 (never blocks; dropped and counted when the queue is full)."""
        try:
            self._queue.put_nowait(json.dumps(message).encode() + b"\n")
        except queue.Full:
            count("coordinator_dropped")

    def close(self, timeout_s: float) -> None:
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _connect(self) -> Optional[socket.socket]:
        delay = 0.05
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                sock = socket.create_connection(self.address, timeout=5)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(json.dumps({"t": "hello", "rank": self.rank}).encode() + b"\n")
                return sock
            except OSError:
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        log_once(
            "coordinator_connect",
            "tf_otel: cannot reach rank 0 at %s:%s; this rank's spans may fall outside their "
            "step root. Set TF_OTEL_COORDINATOR=host:port of rank 0",
            *self.address,
        )
        return None

    def _read(self, sock: socket.socket) -> None:
        try:
            for line in sock.makefile("rb"):
                try:
                    message = json.loads(line)
                except ValueError:
                    count("coordinator_bad_message")
                    continue
                _dispatch(client_handlers.get(message.get("t")), message)
        except (OSError, ValueError):
            pass

    def _run(self) -> None:
        sock = self._connect()
        if sock is not None:
            sock.settimeout(None)
            threading.Thread(
                target=self._read, args=(sock,), name="tf_otel-coord-reader", daemon=True
            ).start()
        while True:
            item = self._queue.get()
            if sock is None:
                if item is None:
                    return
                count("coordinator_dropped")
                continue
            try:
                sock.sendall(item if item is not None else b'{"t":"bye"}\n')
            except OSError as exc:
                log_once("coordinator_send", "tf_otel: lost connection to rank 0 (%s)", exc)
                sock = None
            if item is None:
                if sock is not None:
                    sock.close()
                return
