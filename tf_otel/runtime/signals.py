"""Exit and SIGTERM: flush the pipeline without ever taking SIGTERM from the program.

Usage::

    from tf_otel.runtime.signals import install_exit_handlers

    install_exit_handlers(5.0)  # once, from instrument(); atexit + a SIGTERM stand-in + watchdog
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from typing import Any

from tf_otel.health import fail_open
from tf_otel.runtime.lifecycle import current_pipeline, shutdown

_exit_handlers_installed = False
SIGTERM_GRACE_S = 1.0
SIGNAL_FLUSH_TIMEOUT_S = 3.0


def install_exit_handlers(exit_timeout_s: float) -> None:
    """Flush on normal exit (within ``exit_timeout_s``, TF_OTEL_EXIT_TIMEOUT_S) and on SIGTERM
    without ever taking SIGTERM from the program.

    The program's own handling decides the process's fate, whenever it is installed:

    - a handler the program set before us stays in place, untouched;
    - where SIGTERM still has its default action, tf_otel stands in for it: flush, then end the
      process exactly as the default would (status 143). A handler the program sets later simply
      replaces ours, and from then on it decides;
    - SIGTERM while the program's handler is installed: a watchdog thread (woken through the
      signal wake-up fd) flushes what it can in the background and never ends the process.

    Python runs signal handlers only in the main thread between bytecodes, so a main thread
    blocked in C++ (a parameter server in ``server.join()``) would never run our stand-in handler:
    the watchdog then flushes and, only while our stand-in is still the installed handler, applies
    the default action itself after SIGTERM_GRACE_S."""
    global _exit_handlers_installed
    if _exit_handlers_installed:
        return
    _exit_handlers_installed = True
    atexit.register(shutdown, exit_timeout_s)
    if threading.current_thread() is not threading.main_thread():
        return
    with fail_open("sigterm"):
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)
        _start_sigterm_watchdog()


_handled = threading.Event()  # our stand-in handler ran


def _ours_installed() -> bool:
    return signal.getsignal(signal.SIGTERM) is _on_sigterm


def _on_sigterm(signum: int, frame: Any) -> None:
    """Stand-in for SIGTERM's default action: flush, then die as the default would. Called by a
    program's later handler that chains to it, it only flushes: that handler decides."""
    _handled.set()
    shutdown(timeout_s=SIGNAL_FLUSH_TIMEOUT_S)
    if _ours_installed():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def flush_in_background(timeout_s: float = SIGNAL_FLUSH_TIMEOUT_S) -> None:
    """Hand what is queued to the exporters now, without closing anything: the program's own
    SIGTERM handler may go on training (a preemption handler checkpoints at the next step)."""
    pipeline = current_pipeline()
    if pipeline is not None:
        pipeline.wake()
    with fail_open("flush"):
        from opentelemetry import trace

        provider = trace.get_tracer_provider()
        if hasattr(provider, "force_flush"):
            threading.Thread(
                target=provider.force_flush,
                args=(int(timeout_s * 1000),),
                name="tf_otel-flush",
                daemon=True,
            ).start()


def _terminate_from_thread() -> None:
    """End the process as an unhandled SIGTERM would. signal.signal() is main-thread only, so
    the default action is restored through libc; SIGKILL if even that is impossible."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal(int(signal.SIGTERM), ctypes.c_void_p(0))  # SIG_DFL
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)
    except Exception:  # noqa: BLE001
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def _start_sigterm_watchdog() -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    if previous != -1:
        # someone (asyncio...) owns the wake-up fd: give theirs back, keep the handler alone
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return

    def watch() -> None:
        while True:
            try:
                data = os.read(read_fd, 64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM not in data or _handled.wait(0.2):
                continue
            if not _ours_installed():  # the program's handler decides; we only flush
                flush_in_background()
                continue
            shutdown(timeout_s=SIGNAL_FLUSH_TIMEOUT_S)  # our stand-in is stuck behind C++
            if not _handled.wait(SIGTERM_GRACE_S) and _ours_installed():
                _terminate_from_thread()

    threading.Thread(target=watch, name="tf_otel-sigterm", daemon=True).start()
