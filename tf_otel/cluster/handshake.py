"""The job key's mutual handshake that opens every connection to rank 0's coordinator and to a
host relay: the server's challenge, the peer's hello (its rank, its MAC over the challenge,
its own nonce), the server's welcome (its MAC over that nonce). Anything else is refused and
counted (``coordinator_refused``, the first one logged with what was wrong).

Usage::

    accepted = await accept_hello(reader, writer, peer, key, world_size)  # the server's side
    if accepted is not None:
        rank, relay, welcome = accepted; writer.write(welcome)
    # the peer's side: cluster/coordinator_client.py (SERVICE / RELAY_SERVICE, parse_hex)

The MAC binds the role: a host relay's hello is signed for RELAY_SERVICE, a rank's for SERVICE,
so a rank's credentials cannot open a relay's seat (job/job_secret.py).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Optional, Tuple

from tf_otel.cluster import messages
from tf_otel.cluster.framing import LineConnection
from tf_otel.cluster.messages import BadMessage, decode, encode
from tf_otel.health import log_once
from tf_otel.job import job_secret

if TYPE_CHECKING:  # typing_extensions: only for the checker (TypeIs is in typing from 3.13)
    from typing_extensions import TypeIs

SERVICE = "coordinator"
RELAY_SERVICE = "coordinator.relay"  # a host relay's hello: its MAC binds it to this role
HANDSHAKE_TIMEOUT_S = 5.0


def _is_int(value: Any) -> TypeIs[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_hex(value: Any, size: int) -> Optional[bytes]:
    if not isinstance(value, str) or len(value) != 2 * size:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


def refuse(peer: Any, why: str) -> None:
    log_once(  # counts "coordinator_refused" every time, logs the first
        "coordinator_refused",
        "tf_otel: coordinator refused a connection from %s (%s); every rank must hold the same "
        "job secret (TF_OTEL_JOB_SECRET)",
        peer,
        why,
    )


async def accept_hello(
    reader: LineConnection,
    writer: asyncio.StreamWriter,
    peer: Any,
    key: bytes,
    world_size: int,
    relays: bool = True,
) -> Optional[Tuple[int, bool, bytes]]:
    """(rank, whether it is a host relay, the welcome to send) of a peer that proved the job
    key, or None: refused and counted. The server's side of the handshake, for rank 0 and for
    a host relay (``relays=False``: a relay serves ranks, never another relay)."""
    server_nonce = job_secret.nonce()
    writer.write(encode({"t": messages.CHALLENGE, "n": server_nonce.hex()}))
    try:  # a silent stranger does not keep a seat
        line = await asyncio.wait_for(reader.readline(), HANDSHAKE_TIMEOUT_S)
    except (asyncio.TimeoutError, OSError):
        refuse(peer, "no hello in time")
        return None
    except ValueError:  # longer than MAX_LINE
        refuse(peer, "no hello: a line too long")
        return None
    try:
        message = decode(line)
    except BadMessage as exc:
        refuse(peer, f"no hello: {exc}")
        return None
    if message["t"] != messages.HELLO:
        refuse(peer, "no hello")
        return None
    rank = message.get("rank")
    relay = message.get("relay") == 1 and relays
    service = RELAY_SERVICE if relay else SERVICE
    mac = parse_hex(message.get("mac"), job_secret.MAC_BYTES)
    client_nonce = parse_hex(message.get("cn"), job_secret.NONCE_BYTES)
    if not _is_int(rank) or not 0 < rank < world_size:
        refuse(peer, f"rank {str(rank)[:20]!r} is not in 1..{world_size - 1}")
        return None
    if (
        mac is None
        or client_nonce is None
        or not job_secret.check(job_secret.client_mac(key, service, server_nonce, rank), mac)
    ):
        refuse(peer, f"wrong credentials for rank {rank}")
        return None
    proof = job_secret.server_mac(key, service, client_nonce, rank).hex()
    return rank, relay, encode({"t": messages.WELCOME, "mac": proof})
