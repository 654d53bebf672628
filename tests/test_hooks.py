"""The public step-hook protocol (tf_otel.hooks): a user's hook, subclassed or matched by shape,
runs around each step in its order, keeps what it returned from the start to the end, sees the
step's error, and puts attributes on the step; docs/guides/HOOKS.md shows examples/step_hook.py,
which (integration) puts the examples seen on every step span of a real TensorFlow run.

Run: ``.venv/bin/python -m pytest -p no:cacheprovider -q tests/test_hooks.py``
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any, ClassVar, List, Optional, Tuple

import pytest

from tf_otel import hooks
from tf_otel.hooks import HookOrder, StepCall, StepError, StepHandle, StepHook
from tf_otel.instrument import _patching

REPO = Path(__file__).resolve().parent.parent


class Batch(StepHook[int]):
    """Subclassed: what on_step_start returns comes back to on_step_end."""

    def __init__(self, seen: List[Tuple[str, Any]]) -> None:
        self.seen = seen

    def on_step_start(self, handle: StepHandle, call: StepCall) -> Optional[int]:
        self.seen.append(("batch start", call.kind))
        return len(call.args[0])

    def on_step_end(
        self, handle: StepHandle, call: StepCall, error: StepError, kept: Optional[int]
    ) -> None:
        self.seen.append(("batch end", type(error).__name__ if error else None))
        if error is None:
            handle.attributes["train.batch"] = kept
            handle.attributes["train.result"] = call.result


class First:
    """By shape only (no StepHook base), ordered before tf_otel's captures."""

    order: ClassVar[int] = HookOrder.OPS - 1

    def __init__(self, seen: List[Tuple[str, Any]]) -> None:
        self.seen = seen

    def on_step_start(self, handle: StepHandle, call: StepCall) -> None:
        self.seen.append(("first start", handle.step))

    def on_step_end(self, handle: StepHandle, call: StepCall, error: StepError, kept: None) -> None:
        self.seen.append(("first end", handle.end_ns > 0))


@pytest.fixture
def steps(monkeypatch):
    """Runs steps through the step wrapper; the handles the pipeline was given come back."""
    ended: List[StepHandle] = []
    pipeline = _patching._get_pipeline()
    end_step = pipeline.end_step

    def recorded(handle, error=None):
        ended.append(handle)
        end_step(handle, error)

    monkeypatch.setattr(pipeline, "end_step", recorded)
    monkeypatch.setattr(_patching, "step_hooks", ())
    was_active = _patching.is_active()
    _patching.activate()

    def run(function, *args):
        return _patching.run_step(function, args, {}, "k", "n", "tf_function")

    yield run, ended
    if not was_active:
        _patching.deactivate_steps()


def test_a_users_hooks_run_around_each_step_in_their_order(steps):
    run, ended = steps
    seen: List[Tuple[str, Any]] = []
    batch, first = Batch(seen), First(seen)
    hooks.add_step_hook(batch)  # registered first, runs second: order decides
    hooks.add_step_hook(first)
    assert run(sum, [1, 2, 3]) == 6
    assert seen == [
        ("first start", ended[0].step),
        ("batch start", "tf_function"),
        ("first end", True),
        ("batch end", None),
    ]
    assert ended[0].attributes["train.batch"] == 3 and ended[0].attributes["train.result"] == 6

    seen.clear()
    with pytest.raises(ZeroDivisionError):
        run(lambda x: 1 / 0, [0])
    assert ("batch end", "ZeroDivisionError") in seen
    assert "train.batch" not in ended[1].attributes

    hooks.remove_step_hook(batch)
    hooks.remove_step_hook(first)
    seen.clear()
    run(sum, [1])
    assert seen == [] and len(ended) == 3  # removed: the step still runs, the hooks do not


def test_the_public_names_are_the_runtimes_own():
    assert typing.Protocol in StepHook.__mro__ and getattr(StepHook, "_is_protocol", False)
    assert hooks.StepHook is _patching.StepHook and hooks.add_step_hook is _patching.add_step_hook
    assert StepHook.order == HookOrder.OTHER  # a subclass that names no place runs after ours
    assert set(hooks.__all__) <= set(vars(hooks))


def test_the_guide_shows_the_example_as_it_is():
    example = (REPO / "examples" / "step_hook.py").read_text()
    guide = (REPO / "docs" / "guides" / "HOOKS.md").read_text()
    assert "```python\n" + example + "```" in guide


@pytest.mark.integration
def test_the_example_puts_the_examples_seen_on_every_step_span(tmp_path: Path):
    from conftest import base_env, example, python, run
    from otlp_files import file_spans

    env = base_env(
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        TF_OTEL_FILE=str(tmp_path / "rank{rank}.jsonl"),
        STEPS="4",
    )
    result = run([python(), example("step_hook.py")], env)
    assert "done steps=4" in result.stdout
    steps = sorted(
        (s["attributes"]["tf_otel.step"], s["attributes"].get("train.examples_seen"))
        for s in file_spans(tmp_path)
        if s["attributes"].get("tf_otel.category") == "step"
    )
    assert steps == [(0, 128), (1, 256), (2, 384), (3, 512)]
