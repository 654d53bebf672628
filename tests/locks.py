"""A lock held by another process, for the tests of the host elections' sweeps.

with held_elsewhere(path):     # a live rank of another process holds flock(path)
    ...                        # let go (the process ends) on leaving
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_HOLD = (
    "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
    "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()"
)


@contextmanager
def held_elsewhere(path: Path) -> Iterator[None]:
    """``path``'s lock held by another process while inside."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)
