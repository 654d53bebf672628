"""Hand-made peers of the cross-rank channel for tests: raw sockets that speak (or fail to speak)
the coordinator's and the clock service's handshake, so a test controls every byte sent."""

from __future__ import annotations

import json
import socket
import time
from typing import Optional, Tuple

from tf_otel.clock import transport
from tf_otel.cluster.handshake import SERVICE
from tf_otel.job import job_secret

HANG_GUARD_S = 20.0  # a test peer never waits longer than this for the server


def coordinator_login(
    address: Tuple[str, int], rank: int, key: bytes
) -> Tuple[socket.socket, bool]:
    """Connect and answer the challenge with ``key``; (socket, True) if rank 0 welcomed us."""
    sock = socket.create_connection(address, timeout=HANG_GUARD_S)
    rfile = sock.makefile("rb")
    challenge = json.loads(rfile.readline())
    nonce = bytes.fromhex(challenge["n"])
    client_nonce = job_secret.nonce()
    mac = job_secret.client_mac(key, SERVICE, nonce, rank)
    hello = {"t": "hello", "rank": rank, "mac": mac.hex(), "cn": client_nonce.hex()}
    sock.sendall(json.dumps(hello).encode() + b"\n")
    line = rfile.readline()
    if not line:
        return sock, False
    welcome = json.loads(line)
    expected = job_secret.server_mac(key, SERVICE, client_nonce, rank)
    return sock, welcome.get("mac") == expected.hex()


def clock_login(host: str, port: int, rank: int, key: bytes) -> Tuple[socket.socket, bool]:
    """Connect to the clock service and answer its challenge with ``key``."""
    sock = socket.create_connection((host, port), timeout=HANG_GUARD_S)
    challenge = _read(sock, len(transport.MAGIC) + job_secret.NONCE_BYTES)
    nonce = challenge[len(transport.MAGIC) :]
    client_nonce = job_secret.nonce()
    mac = job_secret.client_mac(key, transport.SERVICE, nonce, rank)
    sock.sendall(transport.FRAME.pack(transport.HELLO, rank) + mac + client_nonce)
    proof = _read(sock, job_secret.MAC_BYTES)
    return sock, proof == job_secret.server_mac(key, transport.SERVICE, client_nonce, rank)


def send_and_drain(sock: socket.socket, payload: bytes) -> float:
    """Send ``payload``, half-close, read until the server closes; AssertionError if it hangs."""
    t0 = time.monotonic()
    sock.settimeout(HANG_GUARD_S)
    try:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass
    except socket.timeout:
        raise AssertionError(f"the server hung: no close within {HANG_GUARD_S} s") from None
    except OSError:
        pass  # the server may close first (a refused stranger)
    finally:
        sock.close()
    return time.monotonic() - t0


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def wait_until(predicate, timeout_s: float = 10.0) -> Optional[bool]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
