"""One clock sync per host: the ranks on a host read one clock, so one of them (the leader) runs
the rounds with rank 0 and the others take its model from a file on the host.

Usage (done by clock.sync.ClockSync with ``share_host=True``)::

    share = HostShare.for_job(job_id, host)   # None where no private directory can be had
    share.claim()               # True: this process leads (holds the host's lock until it exits)
    share.publish(model, rounds)            # the leader, after each round (rank 0: identity)
    got = share.read()          # a follower: (model, rounds) from the live leader, or None

Files live in a directory of this user's only (0700, not a link) under the temp dir, named by
the job id and host. The lock is an flock the kernel releases when its holder dies, so a
follower that tries again takes over. The leader writes its pid into the lock file and the
model; a follower takes a model only from the leader that holds the lock now (never a model
left by an earlier job with the same id).

Files do not pile up: a leader that lets go (``release``, from ClockSync.stop: the pipeline's
shutdown, also from atexit) removes its files first, still holding the lock (``let_go``; a
rank that locked the removed file meanwhile lets go and tries the path again: ``take_lock``),
and a process's first share sweeps the files of shares nobody leads, untouched for
STALE_AGE_S (a leader killed), each under its lock (``sweep_once``). The host relay's election
(cluster/host_relay.py, ``relay-*`` files) elects with the same functions (host_election.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Optional, Tuple

from tf_otel.clock import ClockModel
from tf_otel.host_election import let_go, private_dir, sweep_once, take_lock


class HostShare:
    """The host's clock model file and its leader lock, for one job."""

    def __init__(self, directory: Path, name: str) -> None:
        self.model_path = directory / f"clock-{name}.json"
        self.lock_path = directory / f"clock-{name}.lock"
        self._lock_fd: Optional[int] = None
        # claim, publish and release one at a time: ClockSync's thread may still run a round
        # (and publish it, or claim) while stop() releases, past its join's timeout
        self._mutex = threading.Lock()
        self._released = False

    @classmethod
    def for_job(cls, job_id: str, host: str) -> Optional[HostShare]:
        directory = private_dir()
        if directory is None:
            return None
        sweep_once(directory, "clock")  # the files of shares long left by their leaders
        name = hashlib.sha256(f"{job_id}\0{host}".encode()).hexdigest()[:24]
        return cls(directory, name)

    @property
    def leading(self) -> bool:
        return self._lock_fd is not None

    def claim(self) -> bool:
        """Lead the host if nobody alive does; True while this process leads (never again
        once released)."""
        with self._mutex:
            if self._lock_fd is not None:
                return True
            if self._released:
                return False
            fd = take_lock(self.lock_path)
            if fd is None:
                return False
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            self._lock_fd = fd
            return True

    def publish(self, model: ClockModel, rounds: int) -> None:
        """The leader's model after a round: written whole, then renamed over the old one."""
        with self._mutex:
            if self._lock_fd is not None:
                self._write(model, rounds)

    def _write(self, model: ClockModel, rounds: int) -> None:
        data = {
            "pid": os.getpid(),
            "rounds": rounds,
            "offset_ns": model.offset_ns,
            "drift": model.drift,
            "anchor_ns": model.anchor_ns,
            "uncertainty_ns": model.uncertainty_ns,
        }
        tmp = self._temp_path()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(data, out)
        os.replace(tmp, self.model_path)

    def read(self) -> Optional[Tuple[ClockModel, int]]:
        """The live leader's model and its rounds; None before it published (or none leads)."""
        try:
            leader = int(self.lock_path.read_text().strip() or "0")
            data = json.loads(self.model_path.read_text())
            if not leader or data.get("pid") != leader:
                return None
            model = ClockModel(
                int(data["offset_ns"]),
                float(data["drift"]),
                int(data["anchor_ns"]),
                int(data["uncertainty_ns"]),
            )
            return model, int(data["rounds"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def release(self) -> None:
        """Let go for good: a leader removes its files (model, a publish cut short, the lock
        file) while it still holds the lock, then lets go of it; the next leader makes new
        ones."""
        with self._mutex:
            self._released = True
            fd, self._lock_fd = self._lock_fd, None
            if fd is not None:
                let_go(fd, self.lock_path, self.model_path, self._temp_path())

    def _temp_path(self) -> Path:
        return self.model_path.with_suffix(f".{os.getpid()}.tmp")
