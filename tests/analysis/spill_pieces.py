"""A block's spill pieces read back, from the Python spill and from the native one, to compare.

Usage::

    expected = python_pieces(rows)                 # spill._write of these rows
    found = native_pieces(decoder.spill_block(...))  # LineDecoder.spill_block's answer
    # each: ([(trace id, head, rows) as marshal.loads reads them], job ids sorted, span count)
    # (sorted: two equal sets can print in different orders, and the fuzz test compares reprs)
"""

from __future__ import annotations

import io
import marshal
from typing import Any, List, Set

from tf_otel.analysis.load import spill
from tf_otel.analysis.load.otlp_native import SpilledBlock
from tf_otel.analysis.model import Row


def python_pieces(rows: List[Row]) -> Any:
    out, pieces, jobs = io.BytesIO(), [], set()  # type: ignore[var-annotated]
    count = spill._write(out, rows, pieces, jobs)
    written = out.getvalue()
    loaded = [
        (trace, marshal.loads(written[at : at + head]), marshal.loads(written[at + head :][:rows]))
        for trace, at, head, rows in pieces
    ]
    return loaded, sorted(jobs), count


def native_pieces(spilled: SpilledBlock) -> Any:
    lengths, written, jobs, count = spilled
    loaded, at = [], 0
    for trace, head, rows in lengths:
        loaded.append(
            (
                trace,
                marshal.loads(written[at : at + head]),
                marshal.loads(written[at + head : at + head + rows]),
            )
        )
        at += head + rows
    assert at == len(written)  # the pieces, one after another, and nothing else
    named: Set[str] = set(jobs)
    return loaded, sorted(named), count
