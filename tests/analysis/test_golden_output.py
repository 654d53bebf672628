"""``tf-otel analyze --format json`` on fixed trace files gives byte-identical output.

The guard for behaviour-preserving refactors: a change that alters analysis output on
purpose regenerates the expected files (tests/analysis/golden/make_golden.py) in the same
commit and says why.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))

import make_golden  # noqa: E402


@pytest.mark.parametrize("case", make_golden.CASES)
def test_analyze_json_is_byte_identical(case: str) -> None:
    expected = (GOLDEN / f"{case}.expected.json").read_bytes()
    actual = make_golden.analyze(case)
    if actual != expected:
        diff = difflib.unified_diff(
            expected.decode().splitlines(),
            actual.decode().splitlines(),
            "expected",
            "actual",
            lineterm="",
            n=2,
        )
        pytest.fail(f"{case}: analyze output changed:\n" + "\n".join(list(diff)[:60]))


def test_golden_inputs_exercise_the_analysis() -> None:
    # The fixtures must keep covering what the guard is for: stragglers, repairs, gaps.
    perturbed = (GOLDEN / "perturbed.expected.json").read_text()
    assert '"missing_ranks": [\n        3\n      ]' in perturbed
    assert "straggler" in (GOLDEN / "demo.expected.json").read_text()
