"""Operator-facing lines reach stderr exactly once, whatever logging the program or distro set up.

Usage::

    from tf_otel.stderr_once import install
    install()   # at import of tf_otel: idempotent, cheap, imports nothing heavy

tf_otel's own lines (logger ``tf_otel``) and the export-failure lines it rewrites on the OTel
exporters' loggers still propagate as usual, so an OpenTelemetry ``LoggingHandler`` (the distro's,
on the root logger) sends them through the OTel log pipeline. Python's last-resort stderr handler
never fires once any handler exists (the distro installs one), so this handler writes the line to
stderr itself, unless a handler on the record's way up already writes to stderr at that level
(a program's ``logging.basicConfig()``, say): then the program's handler prints it and this one
stays quiet. Either way the person running the job sees it once.
"""

from __future__ import annotations

import logging
import sys
from typing import Iterable, Optional

_FORMAT = "%(message)s"


def _writes_to_stderr(handler: logging.Handler, level: int) -> bool:
    """A stream handler whose stream is the process's stderr and that passes this level."""
    if isinstance(handler, StderrOnce) or level < handler.level:
        return False
    if isinstance(handler, logging.FileHandler) or not isinstance(handler, logging.StreamHandler):
        return False
    stream = getattr(handler, "stream", None)
    if stream is None:
        return False
    if stream is sys.stderr or stream is sys.__stderr__:
        return True
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False


def handlers_on_the_way_up(logger: logging.Logger) -> Iterable[logging.Handler]:
    """The handlers a record logged on ``logger`` reaches (logging's own propagation walk)."""
    node: Optional[logging.Logger] = logger
    while node is not None:
        yield from node.handlers
        if not node.propagate:
            return
        node = node.parent


def printed_elsewhere(logger: logging.Logger, level: int) -> bool:
    """True when another handler on the record's path already writes it to stderr."""
    return any(_writes_to_stderr(h, level) for h in handlers_on_the_way_up(logger))


class StderrOnce(logging.Handler):
    """Writes WARNING and above to stderr unless another handler on the way up already does."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter(_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if printed_elsewhere(logging.getLogger(record.name), record.levelno):
                return
            stream = sys.stderr or sys.__stderr__
            if stream is None:
                return
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stderr must not reach the training thread
            pass


_HANDLER = StderrOnce()

# the OTel exporters' loggers whose first failure tf_otel rewrites into one operator line
# (otel.sdk.quiet_exporter_logs)
EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk._shared_internal",
)
LOGGERS = ("tf_otel", *EXPORTER_LOGGERS)


def install(names: Iterable[str] = LOGGERS) -> None:
    """Put the one shared handler on each logger (idempotent)."""
    for name in names:
        logger = logging.getLogger(name)
        if _HANDLER not in logger.handlers:
            logger.addHandler(_HANDLER)
