"""Rank 0's live comparison with a reference run (cluster/baseline.py): a window slower beyond
the noise is said with the rank whose lateness grew; a window at the reference, the warm-up and
another step function are not; an unusable reference is one log line naming it."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from tf_otel.cluster import baseline as live
from tf_otel.cluster.baseline import WARMUP_STEPS, WINDOW, LiveBaseline


def _reference(tmp_path: Path, median_ms: float = 100.0, sigma_ms: float = 2.0) -> str:
    profile = {
        "series": "train_step",
        "step_ms": {"median": median_ms, "sigma": sigma_ms, "n": 200},
        "by_rank": {"0": {"lateness_ms": 0.5}, "1": {"lateness_ms": 0.4}},
    }
    path = tmp_path / "reference.json"
    path.write_text(json.dumps({"schema_version": 2, "summary": {}, "profile": profile}))
    return str(path)


def _feed(baseline: LiveBaseline, key: str, steps: int, ms: float, late_rank1_ms: float = 0.4):
    rng = random.Random(3)
    found = []
    for step in range(steps):
        duration = int((ms + rng.uniform(-2, 2)) * 1e6)
        lateness = {0: int(0.5e6), 1: int(late_rank1_ms * 1e6)}
        window = baseline.observe(key, step, duration, lateness)
        if window is not None:
            found.append(window)
    return found


def test_a_window_at_the_reference_is_no_change(tmp_path):
    baseline = LiveBaseline.load(_reference(tmp_path))
    assert baseline is not None
    windows = _feed(baseline, "tf_function:train_step", WARMUP_STEPS + 3 * WINDOW, 100.0)
    assert [w.verdict for w in windows] == ["no change"] * 3
    assert baseline.observations()[0][1]["tf_otel.verdict"] == "no change"


def test_a_slower_window_names_the_rank_whose_lateness_grew(tmp_path):
    baseline = LiveBaseline.load(_reference(tmp_path))
    windows = _feed(baseline, "tf_function:train_step", WARMUP_STEPS + WINDOW, 130.0, 30.0)
    assert len(windows) == 1 and windows[0].slower
    window = windows[0]
    assert window.ratio == pytest.approx(1.3, rel=0.03)
    assert window.rank == 1 and window.rank_growth_ns == pytest.approx(29.6e6, rel=0.01)
    attributes = window.attributes()
    assert attributes["tf_otel.baseline.rank"] == 1
    assert attributes["tf_otel.baseline.threshold_ms"] < 30.0
    ratio, labels = baseline.observations()[0]
    assert ratio == pytest.approx(1.3, rel=0.03) and labels["tf_otel.verdict"] == "slower"


def test_the_warm_up_and_other_step_functions_are_not_compared(tmp_path):
    baseline = LiveBaseline.load(_reference(tmp_path))
    # the first steps are slow (tracing): left out, so the first window is still no change
    for step in range(WARMUP_STEPS):
        assert baseline.observe("tf_function:train_step", step, int(5e9)) is None
    windows = _feed(baseline, "tf_function:train_step", WINDOW, 100.0)
    assert [w.verdict for w in windows] == ["no change"]
    assert _feed(baseline, "tf_function:evaluate", WARMUP_STEPS + WINDOW, 300.0) == []


def test_memory_is_bounded_by_keys(tmp_path, monkeypatch):
    monkeypatch.setattr(live, "MAX_KEYS", 2)
    baseline = LiveBaseline.load(_reference(tmp_path))
    baseline.series = None  # every key compared
    for key in ("a", "b", "c", "d"):
        _feed(baseline, key, WARMUP_STEPS + 3, 100.0)
    assert len(baseline._keys) == 2 and all(len(w) <= WINDOW for w in baseline._keys.values())


@pytest.mark.parametrize(
    "content, why",
    [
        (None, "No such file"),
        ("not json", "Expecting value"),
        (json.dumps({"schema_version": 2, "summary": {}}), "no profile"),
    ],
)
def test_an_unusable_reference_is_one_line_naming_it(tmp_path, caplog, content, why):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    from tf_otel import health

    health._logged.discard("baseline_unusable")  # one line a process: this test's own
    with caplog.at_level(logging.WARNING, logger="tf_otel"):
        assert LiveBaseline.load(str(path)) is None
    text = caplog.text
    assert f"TF_OTEL_BASELINE={str(path)!r}" in text and why in text, text
