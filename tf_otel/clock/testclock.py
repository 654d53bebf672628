"""TEST ONLY: a skewed, drifting local clock for accuracy tests on one host.

On one host every rank shares one clock, so a recovered offset would always be ~0. To test the
synchronisation, ``TF_OTEL_TEST_CLOCK="<rank>:<skew_ns>:<drift_ppm>"`` (several entries may be
joined with ``,``) shifts the clock that tf_otel reads (``tf_otel.clock.now_ns``) on that rank::

    now_ns() = t + skew_ns + drift_ppm * 1e-6 * (t - t_start)     with t = time.time_ns()

``t_start`` is the first reading. Never set it in production: it falsifies every timestamp that
tf_otel takes on that rank (TF's own C++ timestamps are not shifted; use libfaketime for those).

Usage::

    shift = parse("1:2000000000:200", rank=1)   # TestClock or None
    shift.error_at(true_ns)                     # local - true, the truth a test compares against
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Optional

from tf_otel.health import log_once

ENV = "TF_OTEL_TEST_CLOCK"
_ENTRY = re.compile(r"^\s*(\d+)\s*:\s*([+-]?\d+)\s*:\s*([+-]?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*$")


@dataclass(frozen=True)
class TestClock:
    skew_ns: int
    drift: float  # dimensionless (ppm * 1e-6)
    start_ns: int  # true time of the first reading

    def error_at(self, true_ns: int) -> int:
        """local - true at true time ``true_ns``."""
        return self.skew_ns + int(self.drift * (true_ns - self.start_ns))

    def true_from_local(self, local_ns: int) -> int:
        """Invert the shift: the true time at which the local clock read ``local_ns``."""
        return int((local_ns - self.skew_ns + self.drift * self.start_ns) / (1.0 + self.drift))

    def error_at_local(self, local_ns: int) -> int:
        """local - true when the local clock reads ``local_ns`` (the offset truth is minus this)."""
        return local_ns - self.true_from_local(local_ns)


def parse(raw: Optional[str], rank: int, start_ns: Optional[int] = None) -> Optional[TestClock]:
    """The shift for ``rank`` from a TF_OTEL_TEST_CLOCK value; a bad value is logged once."""
    if not raw or not raw.strip():
        return None
    found: Optional[TestClock] = None
    for entry in raw.split(","):
        match = _ENTRY.match(entry)
        if match is None:
            log_once(
                "config:" + ENV,
                "tf_otel: ignoring %s=%r (expected <rank>:<skew_ns>:<drift_ppm>[,...], e.g. "
                "1:2000000000:200); the clock is not shifted",
                ENV,
                raw,
            )
            return None
        if abs(float(match.group(3))) >= 1e5:
            log_once(
                "config:" + ENV,
                "tf_otel: ignoring %s=%r (drift_ppm must be within +-100000); the clock is not "
                "shifted",
                ENV,
                raw,
            )
            return None
        if int(match.group(1)) == rank and found is None:
            found = TestClock(
                skew_ns=int(match.group(2)),
                drift=float(match.group(3)) * 1e-6,
                start_ns=time.time_ns() if start_ns is None else start_ns,
            )
    return found
