"""The per-job secret that authenticates rank-to-rank-0 connections (coordinator, clock service).

Every rank derives the same key alone, from the first of:

1. ``TF_OTEL_JOB_SECRET`` (set it on every rank; the strong choice for any multi-host job);
2. ``_HOROVOD_SECRET_KEY``: the random key Horovod on Spark hands its ranks (plain ``horovodrun``
   keeps its key in the driver and gives ranks none);
3. ``OMPI_MCA_orte_precondition_transports``: 128 random bits ``mpirun`` (Open MPI, also under
   ``horovodrun --mpi``) puts in every rank's environment of one launch;
4. the job id (tf_otel.job.topology: launcher job/step ids, rendezvous address, TF_CONFIG,
   TF_OTEL_JOB_ID). Weak: the job id is exported on every span and its facts are guessable, so a
   service bound beyond loopback logs one warning naming TF_OTEL_JOB_SECRET.

The handshake (both directions, so a process squatting on rank 0's port cannot feed ranks
either): the server sends a nonce; the client answers
``HMAC-SHA256(key, "client" | service | rank | nonce)`` and its own nonce; the server answers
``HMAC-SHA256(key, "server" | service | rank | client nonce)``.

Usage::

    secret = job_key()                      # JobKey(key=b"...", source="TF_OTEL_JOB_SECRET")
    mac = client_mac(secret.key, "coordinator", server_nonce, rank)
    ok = check(client_mac(secret.key, "coordinator", server_nonce, rank), given_mac)
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from typing import Mapping, Optional

from tf_otel.health import log_once

NONCE_BYTES = 32
MAC_BYTES = 32
# launcher variables that hold a random per-launch secret given only to the ranks
LAUNCHER_SECRETS = (
    "_HOROVOD_SECRET_KEY",
    "OMPI_MCA_orte_precondition_transports",
    "OMPI_MCA_opal_precondition_transports",
)
WEAK = "job id"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
_PROCESS_ID = secrets.token_hex(16)


@dataclass(frozen=True)
class JobKey:
    key: bytes
    source: str  # the variable it came from, or WEAK

    @property
    def weak(self) -> bool:
        return self.source == WEAK


def _derive(source: str, material: str) -> bytes:
    # a fixed domain per source: the same material never yields a key used elsewhere
    return hashlib.sha256(f"tf_otel-job-key\x00{source}\x00{material}".encode()).digest()


def job_key(env: Optional[Mapping[str, str]] = None, job_id: Optional[str] = None) -> JobKey:
    """This process's job key; ``job_id`` defaults to the one tf_otel.job.topology derives."""
    env = os.environ if env is None else env
    from tf_otel.config import Settings

    settings = Settings.from_env(env)
    if settings.job_secret:
        return JobKey(_derive("TF_OTEL_JOB_SECRET", settings.job_secret), "TF_OTEL_JOB_SECRET")
    for name in LAUNCHER_SECRETS:
        value = (env.get(name) or "").strip()
        if value:
            return JobKey(_derive(name, value), name)
    if job_id is None:
        from tf_otel.job.topology import detect

        topo = detect(env, job_id=settings.job_id)
        # no launcher: topology makes up a random id per call; one process keeps one
        job_id = _PROCESS_ID if topo.launcher == "none" and not settings.job_id else topo.job_id
    return JobKey(_derive(WEAK, job_id), WEAK)


def warn_if_weak(secret: JobKey, bind_host: str, service: str) -> None:
    """One warning when a weak key guards a service that others on the network can reach."""
    if secret.weak and bind_host not in LOOPBACK:
        log_once(
            "job_secret_weak",
            "tf_otel: the %s on %s is authenticated only by a key derived from the job id, which "
            "others can guess; set TF_OTEL_JOB_SECRET to the same random value on every rank",
            service,
            bind_host,
        )


def nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def _mac(key: bytes, label: str, service: str, nonce_: bytes, rank: int) -> bytes:
    message = f"{label}\x00{service}\x00{rank}\x00".encode() + nonce_
    return hmac.new(key, message, hashlib.sha256).digest()


def client_mac(key: bytes, service: str, server_nonce: bytes, rank: int) -> bytes:
    """What a rank proves: it has the key, for this service, this connection and this rank."""
    return _mac(key, "client", service, server_nonce, rank)


def server_mac(key: bytes, service: str, client_nonce: bytes, rank: int) -> bytes:
    """What rank 0 proves back (a process squatting on its port cannot)."""
    return _mac(key, "server", service, client_nonce, rank)


def check(expected: bytes, given: bytes) -> bool:
    return hmac.compare_digest(expected, given)
