"""Ports for tests and benches (no pytest needed).

Usage::

    from ports import Tasks, free_port_pair, free_ports, refused_port, with_new_ports

    a, b = free_ports(2)            # for servers that must be given their number up front
    coordinator = free_port_pair()  # p and p + 1 (rank 0's clock service) both free
    with refused_port() as port:    # nothing listens there, nor can while the block runs
        ...

    def start() -> List[str]:       # a cluster: new ports on each try
        ps, worker = free_ports(2)
        with Tasks([ps, worker]) as tasks:
            tasks.start(ps_command, env)
            tasks.start(worker_command, env)
            return tasks.wait([1], timeout=240)  # the worker's output; the ps is killed

    outputs = with_new_ports(start)

Where the server can take port 0 and tell which port it got, that comes first (no race at
all): the OTLP receiver, the clock's TcpServer, TF_OTEL_ADMIN_PORT=0 (logged), a lone
tf.distribute.Server, ``dask scheduler --port 0 --scheduler-file``.

Why the others are picked this way: a port from bind(0) is released before the server (TF,
tf_otel's coordinator, a backend binary) binds it, and bind(0) and every outgoing connect() on
the machine draw from the kernel's ephemeral range, so another process could take it in between.
These ports come from outside that range and outside tf_otel's default coordinator ports, from a
block of their own per process (concurrent test runs and benches walk different ports), each
checked free when picked. Only a process binding that very number can still take one; a cluster
start that meets it is started again with new ports, and only when a server's own output names
one of the test's ports as the one it could not bind (:func:`bind_failure`), never on any other
failure.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import (
    Any,
    Callable,
    Collection,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
)

T = TypeVar("T")

FLOOR = 20000  # below: the default ports of services a machine may run (4317, 8786, 9090 ...)
# tf_otel's default coordinator ports (29400 + 2 * (hash % 500), and + 1 for the clock: tf_otel/
# job/topology.py): a job on this machine without TF_OTEL_COORDINATOR binds one of them
DERIVED = range(29400, 29400 + 2 * 500)
SLOTS = 64  # the candidates in 64 blocks; a process's walk begins at block pid % 64
MIN_CANDIDATES = 1024  # fewer outside the ephemeral range: bind(0) as a last resort
ATTEMPTS = 3  # cluster starts, each with new ports, before a taken port fails the test

_walk: Dict[str, int] = {}  # this process's walk over the candidates: pid, next index


def ephemeral_range() -> Tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def candidates() -> List[int]:
    """The ports this module hands out: from FLOOR up, outside the ephemeral range and DERIVED."""
    low, high = ephemeral_range()
    return [p for p in range(FLOOR, 65536) if not low <= p <= high and p not in DERIVED]


def walk_start(pid: int, count: int) -> int:
    """Where the walk of process `pid` over `count` candidates begins: a block of its own."""
    return (pid % SLOTS) * (count // SLOTS)


def free_ports(n: int = 1) -> List[int]:
    """n distinct ports free right now on every address (held together while picked)."""
    held: List[socket.socket] = []
    try:
        for _ in range(n):
            held += _take(1)
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


def free_port_pair() -> int:
    """A coordinator port p with p + 1 (rank 0's clock service) free as well, both held while
    picked."""
    held = _take(2)
    port = held[0].getsockname()[1]
    for sock in held:
        sock.close()
    return port


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A port p that refuses every connection while the block runs, and p + 1 (a coordinator's
    clock service) too: bound here and never listening, so nobody else can listen there
    meanwhile."""
    held = _take(2)
    try:
        yield held[0].getsockname()[1]
    finally:
        for sock in held:
            sock.close()


def _take(width: int) -> List[socket.socket]:
    """Sockets bound to `width` adjacent free ports: the next ones of this process's walk."""
    ports = candidates()
    if len(ports) < MIN_CANDIDATES:  # the ephemeral range leaves no room
        for _ in range(200):
            with socket.socket() as probe:
                probe.bind(("", 0))
                first = probe.getsockname()[1]
            held = _bind(range(first, first + width))
            if held:
                return held
        raise RuntimeError(f"no {width} adjacent free ports")
    allowed = set(ports)
    if _walk.get("pid") != os.getpid():  # first use, or a forked child: its own block
        _walk.update(pid=os.getpid(), next=walk_start(os.getpid(), len(ports)))
    for _ in range(len(ports)):
        first = ports[_walk["next"] % len(ports)]
        _walk["next"] += 1
        run = range(first, first + width)
        if all(p in allowed for p in run):
            held = _bind(run)
            if held:
                _walk["next"] += width - 1
                return held
    raise RuntimeError(f"no {width} adjacent free ports outside the ephemeral range")


def _bind(run: range) -> List[socket.socket]:
    """Sockets bound to every port of `run` on all addresses (TF binds 0.0.0.0), or [] if one is
    taken. No SO_REUSEADDR: a port with a connection in TIME_WAIT counts as taken."""
    held: List[socket.socket] = []
    try:
        for port in run:
            held.append(socket.socket())
            held[-1].bind(("", port))
        return held
    except OSError:
        for sock in held:
            sock.close()
        return []


# -- a cluster start that meets a taken port -----------------------------------------------------


class PortTaken(RuntimeError):
    """A server could not bind a port the test picked for it: another process holds it."""


# What a server prints when it cannot bind its port, each line naming the port:
BIND_FAILED = (
    # TF's gRPC server (tf.distribute.Server, MultiWorkerMirroredStrategy), at ERROR level:
    #   E... add_port.cc:83] Failed to add port to server: No address added out of total 1
    #   resolved for '0.0.0.0:36025'
    # (TF binds 0.0.0.0 without SO_REUSEPORT; for a port this high, only a port in use fails)
    re.compile(r"Failed to add port to server: .*:(\d+)'"),
    # tf_otel's coordinator and clock service (they go on without: the job itself does not fail)
    #   tf_otel: cannot listen on 127.0.0.1:29401 ([Errno 98] ...: address already in use); ...
    #   tf_otel: clock service cannot listen on port 29402 ([Errno 98] Address already in use)
    re.compile(
        r"tf_otel: .*cannot listen on (?:port )?(?:\S+:)?(\d+) \(.*address already in use", re.I
    ),
)


def bind_failure(text: str, ports: Collection[int]) -> Optional[int]:
    """The port of `ports` that a line of `text` says a server could not bind; else None."""
    for line in text.splitlines():
        for pattern in BIND_FAILED:
            found = pattern.search(line)
            if found and int(found.group(1)) in ports:
                return int(found.group(1))
    return None


class Tasks:
    """The processes of one cluster start, the output of each (stdout and stderr together) read
    line by line as it comes: a task that could not bind one of `ports` is seen at once, not when
    the tasks left waiting for it time out. Leaving the block kills every task."""

    def __init__(self, ports: Collection[int]) -> None:
        self.ports = set(ports)
        self.procs: List[subprocess.Popen] = []
        self._lines: List[List[str]] = []
        self._readers: List[threading.Thread] = []
        self._taken: Optional[str] = None

    def start(self, command: Sequence[str], env: Mapping[str, str], **popen: Any) -> int:
        """Start a task; its index."""
        proc = subprocess.Popen(
            list(command), env=dict(env), text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen,
        )  # fmt: skip
        lines: List[str] = []
        reader = threading.Thread(target=self._read, args=(proc, lines), daemon=True)
        self.procs.append(proc)
        self._lines.append(lines)
        self._readers.append(reader)
        reader.start()
        return len(self.procs) - 1

    def _read(self, proc: subprocess.Popen, lines: List[str]) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            port = bind_failure(line, self.ports)
            if port is not None and self._taken is None:
                self._taken = f"port {port} was taken before a task could bind it: {line.strip()}"

    def output(self, index: int) -> str:
        """What task `index` has printed so far (all of it once the block is left)."""
        return "".join(self._lines[index])

    def wait(self, until: Sequence[int], timeout: float) -> List[str]:
        """The outputs of the tasks `until`, once they have all ended. PortTaken as soon as any
        task says it could not bind one of the ports; subprocess.TimeoutExpired after
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            ended = not any(self._readers[i].is_alive() for i in until)
            if self._taken is not None:
                raise PortTaken(self._taken)
            if ended:
                for index in until:
                    self.procs[index].wait()
                return [self.output(i) for i in until]
            if time.monotonic() > deadline:
                output = "".join(self.output(i) for i in until)
                raise subprocess.TimeoutExpired(self.procs[until[0]].args, timeout, output)
            time.sleep(0.1)

    def __enter__(self) -> Tasks:
        return self

    def __exit__(self, *exc: Any) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()  # TF servers block in server.join() (C++): only SIGKILL ends them
        for proc in self.procs:
            proc.wait()
        for reader in self._readers:
            reader.join(10)


def with_new_ports(start: Callable[[], T], attempts: int = ATTEMPTS) -> T:
    """start(), which picks its ports and starts its servers; started again with new ports only
    when it raises PortTaken, `attempts` times in all."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except PortTaken as taken:
            if attempt == attempts:
                raise PortTaken(
                    f"{taken} (start {attempt} of {attempts}, each with new ports)"
                ) from None
            print(f"ports: {taken}; starting again with new ports", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")
