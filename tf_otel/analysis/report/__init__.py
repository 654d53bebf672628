"""Report writers: ``terminal`` (default), ``json_report``, ``html`` (SVG swimlanes), ``png``."""

from __future__ import annotations

from typing import List

from tf_otel.analysis.result import AnalysisResult, StepResult


def ms(ns: float, digits: int = 3) -> float:
    return round(ns / 1e6, digits)


def notable_steps(result: AnalysisResult, limit: int) -> List[StepResult]:
    """At most ``limit`` steps: outliers and straggler steps first, then the slowest; in order."""
    if len(result.steps) <= limit:
        return list(result.steps)

    def priority(step: StepResult):
        flagged = step.outlier or step.straggler is not None
        return (not flagged, -step.trace.duration_ns, step.key)

    # keys first: the steps may be read from disk one at a time (``step_store``)
    chosen = sorted(priority(step) for step in result.steps)[:limit]
    return [result.steps[key] for key in sorted(key for _, _, key in chosen)]
