"""A file loaded with the analysis' fast decoders switched on or off (the fast-path tests).

Usage::

    rows = rows_or_error(path, monkeypatch, NATIVE_DECODER=False)   # rows, or the error text
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.load import files


def rows_or_error(path: Path, monkeypatch: pytest.MonkeyPatch, **switches: bool) -> Any:
    """``files.load_file_rows(path)`` with ``files``' switches set, or its error's text."""
    for name, value in switches.items():
        assert hasattr(files, name), name
        monkeypatch.setattr(files, name, value)
    try:
        return files.load_file_rows(path)
    except AnalysisError as error:
        return str(error)
