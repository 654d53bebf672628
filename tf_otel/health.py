"""Fail-open bookkeeping: counters, log-once, and a guard for code that must never hurt training.

Usage::

    from tf_otel.health import fail_open, counters
    with fail_open("keras.wrap"):
        ...  # any exception is logged once per key, counted, and swallowed
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from typing import Any, Callable, Iterator

logger = logging.getLogger("tf_otel")

counters: Counter = Counter()
_logged: set = set()
_lock = threading.Lock()


def count(key: str, n: int = 1) -> None:
    with _lock:
        counters[key] += n


def first_time(key: str) -> bool:
    """True the first time ``key`` is seen (the log-once bookkeeping), False after."""
    with _lock:
        if key in _logged:
            return False
        _logged.add(key)
        return True


def log_once(key: str, message: str, *args: object, level: int = logging.WARNING) -> None:
    """Log ``message`` the first time ``key`` is seen; later calls only count."""
    count(key)
    if first_time(key):
        logger.log(level, message, *args)


@contextlib.contextmanager
def fail_open(key: str) -> Iterator[None]:
    """Swallow any exception from the block: log once per key, count it, keep training."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - instrumentation must never raise into training
        report_failure(key, exc)


def report_failure(key: str, exc: Exception) -> None:
    """What fail_open does with an exception: logged once per key, counted."""
    log_once(
        "error:" + key,
        "tf_otel: %s failed (%s: %s); tracing of this part is skipped, training goes on",
        key,
        type(exc).__name__,
        exc,
    )


def run_bounded(
    name: str, timeout_s: float, target: Callable[..., Any], *args: Any, **kwargs: Any
) -> bool:
    """Run ``target`` on a daemon thread and wait at most ``timeout_s``: for exit work (a flush, a
    provider's shutdown) that an exporter stuck on a wedged collector would otherwise hold. True
    if it finished in time. What it raises (an SDK shutdown left too little of the exit's time
    raises "deadline already exceeded") is counted ``exit_work_failed`` and logged at debug
    level: exit work never prints a traceback."""

    def work() -> None:
        try:
            target(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - at exit: nothing to skip, nothing to raise into
            count("exit_work_failed")
            logger.debug("tf_otel: %s failed at exit (%s: %s)", name, type(exc).__name__, exc)

    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return not thread.is_alive()
