"""One deadline for a whole shutdown: the stages of a rank's exit (the export worker, the link
to rank 0 and its relay, rank 0's last roots, clock and metrics, the SDK's flush) share the
time given (``TF_OTEL_EXIT_TIMEOUT_S``) instead of each taking up to its own limit.

Usage::

    deadline = Deadline(timeout_s)
    worker.join(deadline.left())               # what is left of it
    close_link(client, deadline.left(2.0))     # at most 2 s of what is left
"""

from __future__ import annotations

import time
from typing import Optional


class Deadline:
    """A point in monotonic time ``timeout_s`` from now (never before now)."""

    __slots__ = ("_at",)

    def __init__(self, timeout_s: float) -> None:
        self._at = time.monotonic() + max(0.0, timeout_s)

    def left(self, cap: Optional[float] = None) -> float:
        """Seconds until the deadline (0 once past), at most ``cap``."""
        left = max(0.0, self._at - time.monotonic())
        return left if cap is None else max(0.0, min(cap, left))
