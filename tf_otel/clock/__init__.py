"""One clock for all ranks: local time reading and the local -> reference (rank 0) mapping.

Usage::

    from tf_otel import clock
    t = clock.now_ns()                      # the clock every tf_otel source reads
    model = clock.current_model()           # offset + drift model against rank 0
    ref_ns = model.to_reference(t)

The identity model is in force until a synchronisation has run (tf_otel.clock.sync).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ClockModel:
    """reference_ns = local_ns + offset_ns + drift * (local_ns - anchor_ns)."""

    offset_ns: int = 0
    drift: float = 0.0
    anchor_ns: int = 0
    uncertainty_ns: int = 0

    def offset_at(self, local_ns: int) -> int:
        return self.offset_ns + int(self.drift * (local_ns - self.anchor_ns))

    def to_reference(self, local_ns: int) -> int:
        return local_ns + self.offset_at(local_ns)


IDENTITY = ClockModel()
_model = IDENTITY


def now_ns() -> int:
    """The local clock tf_otel reads (time.time_ns, shifted by TF_OTEL_TEST_CLOCK in tests)."""
    return time.time_ns()


def current_model() -> ClockModel:
    return _model


def set_model(model: ClockModel) -> None:
    global _model
    _model = model
