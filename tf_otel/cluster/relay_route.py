"""Which way a rank's step reports go to rank 0: through its host's relay (cluster/host_relay.py),
or directly. One rank of each host leads, elected as the clock's host share is (host_election.py)
with a lock file of its own, so that each leader's death is survived on its own.

Usage (done by cluster.services)::

    client = coordinator_link(settings, topology, address, handlers)  # a rank > 0
    client.report(key, step, start_ns, end_ns, wait_ns)  # to the host's relay (or rank 0)
    election = lead_directly(settings, topology)  # rank 0: its host's ranks talk to it directly
    close_link(client, timeout_s)        # a leader's relay goes with it

Ranks on rank 0's host go to rank 0 directly. When a leader dies its ranks connect again through
the next lock holder (``RelayRoute``), else rank 0; the steps the dead relay held go out
partial. On by default where a host runs several ranks; TF_OTEL_HOST_RELAY=0 turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Optional, Union

from tf_otel.cluster.coordinator_client import CoordinatorClient
from tf_otel.cluster.exit_deadline import Deadline
from tf_otel.cluster.host_relay import Address, HostRelay
from tf_otel.cluster.messages import Handlers
from tf_otel.config import Settings
from tf_otel.health import count
from tf_otel.host_election import let_go, private_dir, sweep_once, take_lock
from tf_otel.job import job_secret
from tf_otel.job.topology import Topology, resolve_address

RELAY_WAIT_MAX_S = 0.25  # a step's extents wait this long at most for the host's other ranks
FIND_LEADER_S = 2.0  # a rank that lost the election waits this long for the leader's address
RELAY_TRIES = 3  # tries in a row at one relay address (each failed or ended), then rank 0 once
DIRECT = "direct"  # published by rank 0 for its own host: talk to rank 0 directly


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
