"""Fastest path for ``TracesData`` lines: the native decoder (``tf_otel_native``, Rust).

``tf_otel_native`` (built from native/ by ``make install``; optional, never required) parses a
line and makes its rows without a Python call per span. It makes an attribute list's row fields
itself (as ``rows.RowBuilder.tail``) where every attribute the analysis reads is a plain scalar
of its slot's type; what else follows the analysis' own rules is asked of ``_Helper`` below, with
the generic path's code, once per distinct resource, unusual attribute list or unusual id, and
cached in the decoder. A line outside the plain layout gives ``None`` and the caller decodes it
on the other paths, as for the msgspec fast path (``otlp_msgspec``). Chosen by ``decoders``.

Usage::

    decoder = NativeLineDecoder()           # only when AVAILABLE
    rows = decoder.decode(data, begin, end) # data[begin:end]: one line; rows or None
    spilled = decoder.spill_block(data, stop, SKELETON_SETS)  # a block's spill pieces, or None
"""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, List, Optional, Tuple

from tf_otel.analysis.load._json import loads
from tf_otel.analysis.load.otlp import kept_value
from tf_otel.analysis.load.rows import FOUND_TEMPLATE, SLOT_KEYS, RowBuilder, RowTail, normalise_id
from tf_otel.analysis.model import ANALYSIS_ATTRIBUTES, Row
from tf_otel.analysis.otlp_values import attributes_dict
from tf_otel.record import ATTR_JOB_ID

try:  # optional speed-up, never required
    import tf_otel_native
except ImportError:  # pragma: no cover - depends on the build
    tf_otel_native = None  # type: ignore[assignment]

AVAILABLE = tf_otel_native is not None
NATIVE_FORMAT = 5  # the helper protocol below; the module states the one it was built for
if tf_otel_native is not None and getattr(tf_otel_native, "FORMAT", None) != NATIVE_FORMAT:
    tf_otel_native = None  # type: ignore[assignment]  # an older build: make install rebuilds it
    AVAILABLE = False

_IMMUTABLE = (str, int, float, bool, type(None))

# a block spilled natively: (trace id, its skeleton's length, its rows' length) a piece, those
# bytes marshalled one piece after another, the job ids, the span count
SpilledBlock = Tuple[List[Tuple[str, int, int]], bytes, List[str], int]


class _Helper:
    """What the native decoder asks once per distinct value: the generic path's rules."""

    def __init__(self) -> None:
        self._build = RowBuilder()

    def resource(self, raw: bytes) -> Tuple[Dict[str, Any], RowTail, bool]:
        """A resource's attributes, the row tail of a span without attributes under it, and
        whether it names the job (then the spans' own job ids are not read)."""
        attributes = attributes_dict((loads(raw) or {}).get("attributes"))
        self._build.set_resource(attributes)
        return attributes, self._build.tail(FOUND_TEMPLATE.copy()), ATTR_JOB_ID in attributes

    def tail(self, resource: Dict[str, Any], raw: bytes) -> Tuple[RowTail, bool]:
        """The row tail of an attribute list with this resource, and whether spans may share
        it (no list or dict value: those are each span's own)."""
        self._build.set_resource(resource)
        found = FOUND_TEMPLATE.copy()
        shared = True
        for pair in loads(raw) or ():
            key = pair["key"]
            if key in ANALYSIS_ATTRIBUTES:
                value = found[key] = kept_value(pair)
                shared = shared and type(value) in _IMMUTABLE
        return self._build.tail(found), shared

    @staticmethod
    def normalise_id(raw: str, size: int) -> Optional[str]:
        return normalise_id(raw, size)


class NativeLineDecoder:
    """Decodes the lines of one input; its caches live as long as it does."""

    def __init__(self) -> None:
        assert tf_otel_native is not None, "tf_otel_native is not built (make install)"
        kept = sorted(ANALYSIS_ATTRIBUTES - frozenset(SLOT_KEYS))
        self._decoder = tf_otel_native.LineDecoder(_Helper(), list(SLOT_KEYS), kept)

    def decode(self, data: bytes, begin: int, end: int) -> Optional[List[Row]]:
        """The rows of ``data[begin:end]``; None where the other paths must decide."""
        return self._decoder.decode(data, begin, end)

    def spill_block(
        self, data: bytes, stop: int, sets: Tuple[FrozenSet[str], FrozenSet[str], FrozenSet[str]]
    ) -> Optional[SpilledBlock]:
        """The pieces of the lines of ``data[:stop]`` as ``load.spill`` writes them, made
        without a Python object per span; None where a line or value is not read natively.
        ``sets``: the skeleton's category sets (``analysis.skeleton.SKELETON_SETS``)."""
        skeleton, not_timeline, sync = (sorted(categories) for categories in sets)
        return self._decoder.spill_block(data, stop, skeleton, not_timeline, sync)

    @property
    def bailed(self) -> int:
        """Lines handed back to the other paths."""
        return self._decoder.bailed

    @property
    def scanned(self) -> int:
        """Lines read by the scanner (the plain layout); the others by the general parser."""
        return self._decoder.scanned

    @property
    def lists_scanned(self) -> int:
        """Distinct attribute lists read by the scanner; the others by the general parser."""
        return self._decoder.lists_scanned

    @property
    def lists_recent(self) -> int:
        """Span attribute lists the scanner took as one of the last few it met, by one
        comparison (``scan::Recent``)."""
        return self._decoder.lists_recent
