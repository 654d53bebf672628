"""Instrumentation fails open: errors inside tf_otel are logged once, counted, and training
goes on with its own result or its own exception."""

from __future__ import annotations

import logging
import time
import types

import pytest

from tf_otel.health import counters
from tf_otel.instrument import _patching, check_tensorflow_version


class _BrokenHook(_patching.StepHook):
    def on_step_start(self, handle, call):
        raise RuntimeError("hook exploded")

    def on_step_end(self, handle, call, error, kept):
        raise RuntimeError("hook exploded again")


@pytest.fixture
def broken_hook():
    hook = _BrokenHook()
    _patching.add_step_hook(hook)
    was_active = _patching.is_active()
    _patching.activate()
    yield hook
    _patching.remove_step_hook(hook)
    if not was_active:
        _patching._active = False


def test_a_failing_hook_neither_stops_nor_changes_the_step(broken_hook, caplog):
    with caplog.at_level(logging.WARNING, logger="tf_otel"):
        results = [
            _patching.run_step(lambda x: x * 2, (21,), {}, "k", "n", "tf_function")
            for _ in range(3)
        ]
    assert results == [42, 42, 42]
    logged = [r.getMessage() for r in caplog.records if "hook exploded" in r.getMessage()]
    assert len(logged) == 2  # once for start, once for end: not once per step
    assert counters["error:_BrokenHook.on_step_start"] >= 3


def test_the_training_functions_own_exception_passes_through(broken_hook):
    def step():
        raise ValueError("the user's bug")

    with pytest.raises(ValueError, match="the user's bug"):
        _patching.run_step(step, (), {}, "k", "n", "tf_function")
    assert _patching.state.depth == 0


def test_old_tensorflow_is_reported_once(caplog):
    with caplog.at_level(logging.WARNING, logger="tf_otel"):
        assert not check_tensorflow_version(types.SimpleNamespace(__version__="2.9.1"))
        assert not check_tensorflow_version(types.SimpleNamespace(__version__="2.9.1"))
        assert check_tensorflow_version(types.SimpleNamespace(__version__="2.21.0"))
    assert sum("TensorFlow 2.9.1" in r.getMessage() for r in caplog.records) == 1


class _SlowHook(_patching.StepHook):
    """Takes 50 ms after the step, and notes the end each step's hooks saw."""

    def __init__(self) -> None:
        self.seen = []

    def on_step_start(self, handle, call):
        return None

    def on_step_end(self, handle, call, error, kept):
        self.seen.append(handle.end_ns)
        time.sleep(0.05)


def test_the_step_ends_before_its_hooks_run(monkeypatch):
    """A hook's own time (here 50 ms) is not the step's, and every hook reads the end the
    step's span gets (the input share was computed on another window than its span's)."""
    first, second = _SlowHook(), _SlowHook()
    handles = []
    real = _patching._get_pipeline()
    end_step = real.end_step

    def recorded(handle, error=None):
        handles.append(handle)
        end_step(handle, error)

    monkeypatch.setattr(real, "end_step", recorded)
    was_active = _patching.is_active()
    _patching.add_step_hook(first)
    _patching.add_step_hook(second)
    _patching.activate()
    try:
        _patching.run_step(lambda: None, (), {}, "k", "n", "tf_function")
    finally:
        _patching.remove_step_hook(first)
        _patching.remove_step_hook(second)
        if not was_active:
            _patching._active = False
    (handle,) = handles
    assert first.seen == second.seen == [handle.end_ns]
    assert handle.end_ns - handle.start_ns < 40_000_000  # the hooks' 100 ms are outside
