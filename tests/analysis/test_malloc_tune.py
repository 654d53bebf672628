"""analysis.malloc_tune: glibc's mmap threshold held where glibc is the C library."""

from __future__ import annotations

import platform

from tf_otel.analysis import malloc_tune


def test_the_threshold_is_held_on_glibc_and_set_once(monkeypatch) -> None:
    monkeypatch.setitem(malloc_tune._state, "fixed", False)
    held = malloc_tune.fixed_mmap_threshold()
    assert held == (platform.libc_ver()[0] == "glibc")
    if held:  # a second call asks nothing of the C library
        monkeypatch.setattr(malloc_tune.ctypes, "CDLL", None)
        assert malloc_tune.fixed_mmap_threshold()
