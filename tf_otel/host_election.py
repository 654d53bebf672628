"""One leader per host, elected by a lock file: the user's private directory, an exclusive flock
the kernel drops when its holder dies, a leader's files removed as it lets go, and the stale
files of elections nobody leads swept. The clock share (clock/host_share.py, ``clock-*``) and
the host relay (cluster/host_relay.py, ``relay-*``) each elect their host's leader with it.

Usage::

    directory = private_dir()                  # None: no private directory to be had
    sweep_once(directory, "relay")             # a process's first election of that kind
    fd = take_lock(directory / "relay-<id>.lock")   # None: another live process leads
    let_go(fd, lock_path, *other_files)        # the leader leaves: its files go first
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Set

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
