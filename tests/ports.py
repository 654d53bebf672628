"""Free ports on 127.0.0.1 for tests and benches (no pytest needed).

Usage::

    from ports import free_ports, free_port_pair
    a, b = free_ports(2)          # any two free ports
    coordinator = free_port_pair()  # p and p + 1 (rank 0's clock service) both free
"""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import List, Tuple

_pick = random.Random()  # private: a test seeding the global random does not fix our picks


def free_ports(n: int = 1) -> List[int]:
    """n distinct ports free on 127.0.0.1 right now (held together while picked)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port_pair() -> int:
    """A coordinator port p with p + 1 (rank 0's clock service) also free, both held while picked.

    Chosen outside the kernel's ephemeral range, so a process's outgoing connections (the ranks'
    OTLP clients, Gloo) cannot take p + 1 between the pick and the job binding it; where that
    range leaves no room, p from bind(0) with p + 1 checked.
    """
    low, high = _ephemeral_range()
    spans = [(lo, hi) for lo, hi in ((20000, low - 2), (high + 1, 65534)) if hi - lo >= 64]
    for _ in range(200):
        if spans:
            lo, hi = _pick.choice(spans)
            port = _pick.randrange(lo, hi)
        else:
            port = free_ports()[0]
        if _both_free(port):
            return port
    raise RuntimeError("no two adjacent free ports on 127.0.0.1")


def _both_free(port: int) -> bool:
    a, b = socket.socket(), socket.socket()
    try:
        a.bind(("127.0.0.1", port))
        b.bind(("127.0.0.1", port + 1))
        return True
    except OSError:
        return False
    finally:
        a.close()
        b.close()


def _ephemeral_range() -> Tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999
