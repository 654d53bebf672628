"""A file loaded with one decoder chosen (``load.decoders.CHOICE``; the fast-path tests).

Usage::

    rows = rows_or_error(path, monkeypatch, "reference")   # rows, or the error text
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.load import decoders, files


def choose(decoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaders start with ``decoder`` ("native", "msgspec" or "reference"); skips where this
    installation does not have it."""
    assert decoder in decoders.DECODERS, decoder
    if decoder not in decoders.available():
        pytest.skip(f"the {decoder} decoder is not built here")
    monkeypatch.setattr(decoders, "CHOICE", decoder)


def rows_or_error(path: Path, monkeypatch: pytest.MonkeyPatch, decoder: str) -> Any:
    """``files.load_file_rows(path)`` with ``decoder`` chosen, or its error's text."""
    choose(decoder, monkeypatch)
    try:
        return files.load_file_rows(path)
    except AnalysisError as error:
        return str(error)
