"""Which decoder reads OTLP-JSON trace lines: chosen here, and only here.

Every decoder gives a ``TracesData`` line's spans as the same ``model.Row``s (``rows``' rules):

- ``reference``: ``otlp.decode_traces_rows`` over ``_json.loads`` (orjson, else the stdlib).
  It reads every spelling, names the error of a bad line and reads whole documents; the
  others are tested against it. It is the loaders' own fallback, not a ``LineDecoder``.
- ``msgspec`` (``otlp_msgspec``, where msgspec is installed): typed decoding of only the fields
  read; about half the reference's CPU a span. The reference cannot be folded into it: it is
  what msgspec leaves (other spellings, bad lines) and works without msgspec.
- ``native`` (``otlp_native``, where ``tf_otel_native`` is built): Rust; 43 % fewer
  instructions a span than msgspec, and it writes a spill block's pieces itself.

A fast decoder answers None for a line outside its plain layout and the next one is asked, the
reference last: the choice changes the speed, never the rows or the errors.

Usage::

    CHOICE                          # the fastest available: "native", "msgspec" or "reference"
    for decoder in line_decoders(data):
        rows = decoder.decode(data, begin, end)   # None: the next decoder's (then the reference)
    spiller = block_spiller()       # the native decoder where chosen, else None
"""

from __future__ import annotations

from typing import List, Optional, Protocol

from tf_otel.analysis.load import otlp_msgspec, otlp_native
from tf_otel.analysis.model import Row

# fastest first
DECODERS = ("native", "msgspec", "reference")


class LineDecoder(Protocol):
    """A fast decoder of one input's lines; its caches (ids, attribute lists) last as long as
    it does."""

    def decode(self, data: bytes, begin: int, end: int) -> Optional[List[Row]]:
        """The rows of the line ``data[begin:end]``; None: left to the next decoder."""
        ...


def available() -> List[str]:
    """The decoders this installation has, fastest first (the reference always)."""
    built = {"native": otlp_native.AVAILABLE, "msgspec": otlp_msgspec.AVAILABLE}
    return [name for name in DECODERS if built.get(name, True)]


def fastest() -> str:
    return available()[0]


# the decoder the loaders start with; tests and bench/bench_analysis.py set a slower one
CHOICE: str = fastest()


def line_decoders(data: bytes) -> List[LineDecoder]:
    """New fast decoders for one input (``data``), from ``CHOICE`` down, the reference left."""
    chosen = DECODERS.index(CHOICE)
    decoders: List[LineDecoder] = []
    # the native decoder reads a ``bytes`` object only
    if chosen <= 0 and otlp_native.AVAILABLE and type(data) is bytes:
        decoders.append(otlp_native.NativeLineDecoder())
    if chosen <= 1 and otlp_msgspec.AVAILABLE:
        decoders.append(otlp_msgspec.MsgspecLineDecoder())
    return decoders


def block_spiller() -> Optional[otlp_native.NativeLineDecoder]:
    """The decoder that writes a spill block's pieces itself (no Python object per span), where
    the native one is chosen; None: the block's rows are decoded line by line."""
    if CHOICE == "native" and otlp_native.AVAILABLE:
        return otlp_native.NativeLineDecoder()
    return None
