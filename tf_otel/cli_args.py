"""Argument types for the ``tf-otel`` commands: a bad value is one argparse error naming the
option and the value (exit status 2), never a traceback. And each subcommand's parser, its help
text taken from its module's docstring.

Usage::

    parser = subcommand(subparsers, "export", "write steps as a Perfetto trace", __doc__)
    parser.add_argument("--limit", type=positive_int, default=10000)
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable, TypeVar

N = TypeVar("N", int, float)


def _ranged(kind: Callable[[str], N], ok: Callable[[N], bool], expected: str) -> Callable[[str], N]:
    """A parser of ``kind`` accepting finite values for which ``ok`` holds."""

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            noun = "an integer" if kind is int else "a finite number"
            raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}")
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


positive_int = _ranged(int, lambda v: v > 0, "an integer > 0")
non_negative_int = _ranged(int, lambda v: v >= 0, "an integer >= 0")
positive_float = _ranged(float, lambda v: v > 0, "a number > 0")
non_negative_float = _ranged(float, lambda v: v >= 0, "a number >= 0")
share = _ranged(float, lambda v: 0 <= v <= 1, "a share between 0 and 1")


def subcommand(
    subparsers: Any, name: str, summary: str, doc: str, epilog: bool = True
) -> argparse.ArgumentParser:
    """``name``'s parser: ``doc`` (its module's docstring) as written, its first line the
    description and the rest the epilog (``epilog=False``: all of it the description)."""
    lines = doc.splitlines()
    return subparsers.add_parser(
        name,
        help=summary,
        description=lines[0] if epilog else doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(lines[2:]) if epilog else None,
    )
