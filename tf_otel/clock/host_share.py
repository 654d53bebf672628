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
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Optional, Tuple

from tf_otel.clock import ClockModel


def private_dir() -> Optional[Path]:
    """This user's own directory under the temp dir, or None (someone else's, or a link)."""
    path = Path(tempfile.gettempdir()) / f"tf_otel-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return path


def take_lock(path: Path) -> Optional[int]:
    """An exclusive flock on ``path`` (created 0600, never through a link): its descriptor, or
    None where another live process holds it (the kernel drops it when its holder dies).

    A holder may remove the file as it lets go (the host relay's election does): a lock won on
    a file no longer at ``path`` is no lock at all (the next rank would create and lock a new
    one), so it is let go and ``path`` opened again."""
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        if same_file(fd, path):
            return fd
        os.close(fd)  # its holder removed it between our open and our flock
    return None


def same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` (not followed if a link) is the file open as ``fd``."""
    try:
        opened, named = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)


class HostShare:
    """The host's clock model file and its leader lock, for one job."""

    def __init__(self, directory: Path, name: str) -> None:
        self.model_path = directory / f"clock-{name}.json"
        self.lock_path = directory / f"clock-{name}.lock"
        self._lock_fd: Optional[int] = None

    @classmethod
    def for_job(cls, job_id: str, host: str) -> Optional[HostShare]:
        directory = private_dir()
        if directory is None:
            return None
        name = hashlib.sha256(f"{job_id}\0{host}".encode()).hexdigest()[:24]
        return cls(directory, name)

    @property
    def leading(self) -> bool:
        return self._lock_fd is not None

    def claim(self) -> bool:
        """Lead the host if nobody alive does; True while this process leads."""
        if self._lock_fd is not None:
            return True
        fd = take_lock(self.lock_path)
        if fd is None:
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd
        return True

    def publish(self, model: ClockModel, rounds: int) -> None:
        """The leader's model after a round: written whole, then renamed over the old one."""
        if self._lock_fd is None:
            return
        data = {
            "pid": os.getpid(),
            "rounds": rounds,
            "offset_ns": model.offset_ns,
            "drift": model.drift,
            "anchor_ns": model.anchor_ns,
            "uncertainty_ns": model.uncertainty_ns,
        }
        tmp = self.model_path.with_suffix(f".{os.getpid()}.tmp")
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
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # the kernel drops the flock with the descriptor
            self._lock_fd = None
