"""A spill piece (one trace's rows, marshalled) reads back as the spans written."""

from __future__ import annotations

import io
from array import array
from operator import itemgetter
from pathlib import Path

from tf_otel.analysis.load import spill
from tf_otel.analysis.model import Span, by_trace


def _row(span_id: str, start: int, end: int) -> tuple:
    return Span("ab" * 16, span_id, None, "op", start, end, {"k": 1}, {"tf_otel.rank": 7}).to_row()


def test_pieces_read_back_as_the_rows_written():
    rows = [_row("cd" * 8, 5, 9), _row("ef" * 8, 2**70, 2**70 + 1), _row("12" * 8, 1, 3)]
    out, pieces, jobs = io.BytesIO(), [], set()  # type: ignore[var-annotated]
    assert spill._write(out, rows, pieces, jobs) == 3
    data = out.getvalue()

    class Files:
        def read(self, number: int, offset: int, length: int) -> bytes:
            return data[offset : offset + length]

    index = {t: array("q", (0, o, h, n)) for t, o, h, n in pieces}
    source = spill.SpillSource(Path("unused"), index, set(), Files())  # type: ignore[arg-type]
    assert [s.to_row() for s in source.spans("ab" * 16)] == rows
    skeleton = source.skeleton("ab" * 16)  # the rank's first span; the rest read by rank
    assert [s.to_row() for s in skeleton.spans] == rows[:1]
    assert [s.to_row() for s in skeleton.rest(7)] == rows[1:]
    assert skeleton.rest(8) == []


def test_runs_of_a_trace_are_grouped_in_order():
    a, b = "a" * 32, "b" * 32
    rows = [(a, 1), (a, 2), (b, 3), (a, 4)]
    grouped = by_trace(rows, itemgetter(0))  # as the spill groups a block's rows
    assert grouped == {a: [(a, 1), (a, 2), (a, 4)], b: [(b, 3)]}
