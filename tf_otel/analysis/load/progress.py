"""A one-line progress bar on stderr, shown only on a terminal or when asked (``--progress``).

Usage::

    with Progress("fetching traces", total=len(ids), enabled=None) as bar:
        for trace_id in ids:
            ...
            bar.advance()
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class Progress:
    def __init__(
        self,
        label: str,
        total: Optional[int] = None,
        enabled: Optional[bool] = None,
        stream: Optional[TextIO] = None,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = bool(self.stream.isatty()) if enabled is None else enabled
        self._last_draw = 0.0

    def __enter__(self) -> Progress:
        self._draw(force=True)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._draw(force=True)
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    def advance(self, count: int = 1) -> None:
        self.done += count
        self._draw()

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 0.1:
            return
        self._last_draw = now
        if self.total:
            width = 30
            filled = min(width, int(width * self.done / self.total))
            bar = "#" * filled + "." * (width - filled)
            text = f"\r{self.label} [{bar}] {self.done}/{self.total}"
        else:
            text = f"\r{self.label}: {self.done}"
        self.stream.write(text)
        self.stream.flush()
