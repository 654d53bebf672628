"""One clock for all ranks: local time reading and the local -> reference (rank 0) mapping.

Usage::

    from tf_otel import clock
    t = clock.now_ns()                      # the clock every tf_otel source reads
    model = clock.current_model()           # offset + drift model against rank 0
    ref_ns = model.to_reference(t)

    sync = clock.start_sync(topology, settings)   # every rank, once; None when nothing to do
    ...
    sync.stop()                                   # final round (short timeout), then stop

The identity model is in force until a synchronisation has run (tf_otel.clock.sync).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

from tf_otel.clock import testclock

if TYPE_CHECKING:  # pragma: no cover
    from tf_otel.clock.sync import ClockSync
    from tf_otel.config import Settings
    from tf_otel.job.topology import Topology


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

    def to_local(self, reference_ns: int) -> int:
        """reference ns -> this rank's local clock (inverse of to_reference, one iteration)."""
        return reference_ns - self.offset_at(reference_ns - self.offset_at(reference_ns))


IDENTITY = ClockModel()
_model = IDENTITY

_UNRESOLVED = object()
_test_clock: Union[object, None, testclock.TestClock] = _UNRESOLVED
_resolve_lock = threading.Lock()


def _resolve_test_clock() -> Optional[testclock.TestClock]:
    """Read TF_OTEL_TEST_CLOCK once (lazily, on the first now_ns call)."""
    global _test_clock
    with _resolve_lock:
        if _test_clock is not _UNRESOLVED:
            return _test_clock  # type: ignore[return-value]
        _test_clock = _read_test_clock()
        return _test_clock


def _read_test_clock() -> Optional[testclock.TestClock]:
    from tf_otel.config import Settings

    raw = Settings.from_env().test_clock  # resolved once per process (tests reset it)
    shift = None
    if raw and raw.strip():
        from tf_otel.health import log_once
        from tf_otel.job.topology import detect

        shift = testclock.parse(raw, detect().rank)
        if shift is not None:
            log_once(
                "clock:test_clock",
                "tf_otel: %s=%r shifts this rank's clock (TEST ONLY): skew %d ns, drift %g ppm",
                testclock.ENV,
                raw,
                shift.skew_ns,
                shift.drift * 1e6,
            )
    return shift


def now_ns() -> int:
    """The local clock tf_otel reads (time.time_ns, shifted by TF_OTEL_TEST_CLOCK in tests)."""
    t = time.time_ns()
    shift = _test_clock
    if shift is None:
        return t
    if shift is _UNRESOLVED:
        shift = _resolve_test_clock()
        if shift is None:
            return t
        t = time.time_ns()  # resolving took a while
    return t + shift.skew_ns + int(shift.drift * (t - shift.start_ns))  # type: ignore[attr-defined]


def test_clock() -> Optional[testclock.TestClock]:
    """The TF_OTEL_TEST_CLOCK shift in force on this rank (None: the clock is not shifted)."""
    shift = _test_clock
    if shift is _UNRESOLVED:
        shift = _resolve_test_clock()
    return shift  # type: ignore[return-value]


def reset_test_clock() -> None:
    """Forget the parsed TF_OTEL_TEST_CLOCK so the next reading parses it again (tests)."""
    global _test_clock
    with _resolve_lock:
        _test_clock = _UNRESOLVED


def current_model() -> ClockModel:
    return _model


def set_model(model: ClockModel) -> None:
    global _model
    _model = model


def start_sync(topology: Topology, settings: Settings, **options: Any) -> Optional[ClockSync]:
    """Start synchronising against rank 0 in the background (see tf_otel.clock.sync).

    Call once at start-up on every rank; rank 0 serves, the others measure. ``options`` go to
    ``ClockSync`` (exchanges, transport, ...). Returns None for a world of one or on failure.
    """
    from tf_otel.clock.sync import start_sync as _start

    return _start(topology, settings, **options)
