"""The one exception the analysis raises for bad input; the CLI prints it and exits 2."""

from __future__ import annotations


class AnalysisError(Exception):
    """Bad input (a file, a URL, a selection): the message says which and why."""
