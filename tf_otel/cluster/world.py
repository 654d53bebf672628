"""A world that changes while the job runs (Horovod Elastic): which world ran each step.

Horovod Elastic re-initialises Horovod on every rank after a reset (``hvd.elastic.run``: a host
added or removed, a worker that failed); tf_otel sees the second ``hvd.init()``
(instrument/horovod/patching.py) and the pipeline takes the new size
(``Pipeline.change_world``). Each change starts at the next step of every step key rank 0 has
counted so far (a reset is a barrier: every surviving rank is between the same two steps), so
rank 0's coordinator, its roots and the analysis judge each step by the world that ran it.

Usage::

    history = WorldHistory(3)
    change = history.change(2, {"tf_function:train_step": 24}, left=[2], hosts={2: "10.0.0.3"})
    history.size_of("tf_function:train_step", 23)   # 3
    history.size_of("tf_function:train_step", 24)   # 2
    history.first_step_of("tf_function:train_step", 24)   # the change: its record goes here
    change.text   # "world 3 -> 2 at step 24: rank 2 on host 10.0.0.3 left"
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from tf_otel import record

MAX_CHANGES = 64  # kept; a job that resets more often keeps its latest changes


@dataclass(frozen=True)
class WorldChange:
    """The world ``before`` -> ``after`` from step ``at[key]`` of each key (a key not in ``at``
    began after the change: all its steps are in the new world)."""

    before: int
    after: int
    at: Mapping[str, int]
    left: Sequence[int] = ()
    joined: Sequence[int] = ()
    hosts: Mapping[int, str] = field(default_factory=dict)
    ranks: Sequence[int] = ()  # the new world's, by the ranks its processes began with

    def step(self, key: Optional[str] = None) -> Optional[int]:
        """The first step of the new world (of ``key``; else of the key with the most steps)."""
        if key is not None:
            return self.at.get(key)
        return max(self.at.values()) if self.at else None

    def text(self, key: Optional[str] = None) -> str:
        step = self.step(key)
        where = f" at step {step}" if step is not None else ""
        parts = []
        for ranks, verb in ((self.left, "left"), (self.joined, "joined")):
            if ranks:
                named = ", ".join(
                    f"{r} on host {self.hosts[r]}" if self.hosts.get(r) else str(r) for r in ranks
                )
                parts.append(f"rank{'s' if len(ranks) > 1 else ''} {named} {verb}")
        said = ": " + "; ".join(parts) if parts else ""
        return f"world {self.before} -> {self.after}{where}{said}"

    def attributes(self, key: Optional[str] = None) -> Dict[str, object]:
        """The change record's attributes (a span event on the step root and the job span)."""
        attributes: Dict[str, object] = {
            record.ATTR_WORLD_BEFORE: self.before,
            record.ATTR_WORLD_AFTER: self.after,
            record.ATTR_WORLD_LEFT: list(self.left),
            record.ATTR_WORLD_JOINED: list(self.joined),
            "message": self.text(key),
        }
        step = self.step(key)
        if step is not None:
            attributes[record.ATTR_STEP] = step
        return attributes


class WorldHistory:
    """The world sizes of the job so far, by step (thread-safe: the training thread adds a
    change, rank 0's coordinator and export threads read it)."""

    def __init__(self, size: int) -> None:
        self.first = size
        self.first_ranks: Tuple[int, ...] = tuple(range(size))
        self._changes: List[WorldChange] = []
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """The world now."""
        changes = self._changes
        return changes[-1].after if changes else self.first

    @property
    def changed(self) -> bool:
        return bool(self._changes)

    def change(
        self,
        after: int,
        at: Mapping[str, int],
        left: Sequence[int] = (),
        joined: Sequence[int] = (),
        hosts: Optional[Mapping[int, str]] = None,
    ) -> WorldChange:
        with self._lock:
            before = self._changes[-1].ranks if self._changes else self.first_ranks
            ranks = tuple(sorted((set(before) - set(left)) | set(joined)))
            if len(ranks) != after:  # a count the ranks do not account for: Horovod's 0..n-1
                ranks = tuple(range(after))
            change = WorldChange(
                self.size, after, dict(at), tuple(left), tuple(joined), dict(hosts or {}), ranks
            )
            self._changes = (self._changes + [change])[-MAX_CHANGES:]
        return change

    def size_of(self, key: str, step: int) -> int:
        """The world that ran ``step`` of ``key``."""
        size = self.first
        for change in self._changes:
            start = change.at.get(key, 0)
            if step >= start:
                size = change.after
        return size

    def ranks_of(self, key: str, step: int) -> Tuple[int, ...]:
        """The ranks of the world that ran ``step`` of ``key`` (each process by the rank it
        began with: not 0..n-1 once a rank other than the last has left)."""
        ranks = self.first_ranks
        for change in self._changes:
            if step >= change.at.get(key, 0):
                ranks = tuple(change.ranks)
        return ranks

    def first_step_of(self, key: str, step: int) -> Optional[WorldChange]:
        """The change whose new world begins with ``step`` of ``key``, if any (a key that began
        after the change: its step 0)."""
        for change in reversed(self._changes):
            if change.at.get(key, 0) == step:
                return change
        return None
