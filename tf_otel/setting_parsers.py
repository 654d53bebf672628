"""Parsers of TF_OTEL_* values: each returns the value or raises ValueError saying what it
expected (config.py names the variable and the bad value in its one log line).

Usage::

    from tf_otel import setting_parsers as parse
    parse.port("8790")      # 8790; "99999" -> ValueError("expected a port 0-65535 ...")
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Tuple

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def flag(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("expected one of 1/true/yes/on or 0/false/no/off")


def integer(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError("expected an integer") from None


def number(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError("expected a number") from None


def non_negative_int(text: str) -> int:
    value = integer(text)
    if value < 0:
        raise ValueError("expected an integer >= 0")
    return value


def queue_size(text: str) -> int:
    return max(16, non_negative_int(text))  # a smaller queue drops steps in a burst of 16


def positive_float(text: str) -> float:
    value = number(text)
    if not value > 0:
        raise ValueError("expected a number > 0")
    return value


def non_negative_float(text: str) -> float:
    value = number(text)
    if not value >= 0:
        raise ValueError("expected a number >= 0")
    return value


def core_share(text: str) -> float:
    """A share of one core: more than 0, at most 0.5 (the pacer's ceiling)."""
    value = number(text)
    if not 0 < value <= 0.5:
        raise ValueError("expected a share of one core, more than 0 and at most 0.5")
    return value


def host_port(text: str) -> Tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected HOST:PORT")
    return host, int(port)


def one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError("expected " + " or ".join(choices))
        return value

    return parse


def port(text: str) -> int:
    value = integer(text)
    if not 0 <= value < 65536:
        raise ValueError("expected a port 0-65535 (0: any free port)")
    return value


def directory(text: str) -> str:
    value = text.strip()
    if not value or not os.path.isdir(value):
        raise ValueError("expected an existing directory")
    return value


def names(text: str) -> Tuple[str, ...]:
    """A comma list; blanks dropped."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def text(value: str) -> Optional[str]:
    """Any text; blank: unset."""
    return value.strip() or None
