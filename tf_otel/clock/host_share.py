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
(pipeline/host_relay.py, ``relay-*`` files) does the same with these functions.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from tf_otel.clock import ClockModel
from tf_otel.health import count

STALE_AGE_S = 3600.0  # an election's files untouched this long, its lock not held: swept
_swept: Set[str] = set()  # the kinds of files ("clock", "relay") this process swept


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

    A holder removes the file as it lets go (``let_go``): a lock won on a file no longer at
    ``path`` is no lock at all (the next rank would create and lock a new one), so it is let
    go and ``path`` opened again."""
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


def let_go(fd: int, lock_path: Path, *paths: Path) -> None:
    """A leader lets go of the lock ``fd`` on ``lock_path``: ``paths`` (its election's other
    files) and then the lock file are removed first, the lock still held, so they are this
    leader's (the next leader creates them again); not where the path names another file."""
    if same_file(fd, lock_path):
        for path in (*paths, lock_path):
            _unlink(path)
    os.close(fd)  # the kernel drops the flock with the descriptor


def sweep_once(directory: Path, kind: str) -> None:
    """``sweep_stale`` of ``kind``'s files, the first time this process asks."""
    if kind not in _swept:
        _swept.add(kind)
        sweep_stale(directory, kind)


def sweep_stale(directory: Path, kind: str, max_age_s: float = STALE_AGE_S) -> int:
    """Remove the files of ``kind`` (``<kind>-<24 hex>.lock``, and ``.json``, ``.*.tmp`` beside
    it) in ``directory`` of elections nobody leads and nobody touched for ``max_age_s`` (a
    leader killed, a process gone without its shutdown): each election's under its lock, so
    never one a live rank holds; the elections swept."""
    pattern = re.compile(rf"{re.escape(kind)}-([0-9a-f]{{24}})\.")
    named: Dict[str, List[Path]] = {}
    try:
        for entry in os.scandir(directory):
            found = pattern.match(entry.name)
            if found is not None:
                named.setdefault(found.group(1), []).append(Path(entry.path))
    except OSError:
        return 0
    now, swept = time.time(), 0
    for name, paths in named.items():
        lock_path = directory / f"{kind}-{name}.lock"
        try:
            seen = {path: os.lstat(path) for path in paths}
        except OSError:  # one went meanwhile: its leader just left, or another rank swept
            continue
        if any(now - info.st_mtime < max_age_s for info in seen.values()):
            continue  # recent: a leader's (live, or just gone: left as it was)
        fd = take_lock(lock_path)
        if fd is None:  # a live rank leads that election
            continue
        try:
            before = seen.get(lock_path)
            if before is not None and not os.path.samestat(os.fstat(fd), before):
                continue  # a new lock file since: a rank's, just created
            for path in paths:
                if path != lock_path:
                    _unlink(path)
            _unlink(lock_path)  # last, still locked (take_lock created it if it was gone)
            swept += 1
        except OSError:
            continue
        finally:
            os.close(fd)
    if swept:
        count(f"{kind}_files_swept", swept)
    return swept


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:  # gone already
        pass


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
