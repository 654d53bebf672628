"""A finding from the share of the critical path that a group of categories takes, over the
steady steps that measured every one of them (``measured``): ``communication_bound``, and
``input_bound`` where step spans carry no input wait of their own.

Usage::

    path_share_findings(result, "communication_bound", [PATH_COMMUNICATION, PATH_STRAGGLER_WAIT],
                        0.30, what="communication", suggestion="Reduce or hide ...")

Measured on no step: no finding (a category that was not measured is not 0 %). Measured on some
steps only: the summary says over how many, and under ``FEW_STEPS`` of them the finding is
graded low whatever its share (one sampled step of tf_cnn_benchmarks, out of 26, read 67 %
communication: a share, not yet the run's).
"""

from __future__ import annotations

from typing import Dict, List

from tf_otel.analysis.result import AnalysisResult, Finding
from tf_otel.analysis.rules.finding_figures import ms, severity

FEW_STEPS = 3  # steady steps measured: fewer grade the finding low


def path_share_findings(
    result: AnalysisResult,
    rule: str,
    categories: List[str],
    threshold: float,
    what: str,
    suggestion: str,
) -> List[Finding]:
    """``rule`` when ``categories`` together take >= ``threshold`` of the critical path;
    ``what`` names them in the summary ("input wait is 20 % of the critical path")."""
    measured = result.group_share(categories)
    share = measured.share
    if not result.steps or share is None or share < threshold:
        return []
    few = measured.measured_steps < FEW_STEPS
    over = (
        ""
        if measured.measured_steps == measured.steps
        else f" (over the {measured.measured_steps} of {measured.steps} steady steps where it "
        f"was measured{f'; graded low under {FEW_STEPS}' if few else ''})"
    )
    by_category = _measured_by_category(result, categories)
    return [
        Finding(
            rule=rule,
            severity="low" if few else severity(share),
            summary=f"{what} is {share:.0%} of the critical path{over}",
            evidence={
                "share": round(share, 4),
                "threshold": threshold,
                "critical_path_ms": {c: ms(by_category[c]) for c in categories},
                "total_critical_path_ms": ms(measured.path_ns),
                "measured_steps": measured.measured_steps,
                "steps": measured.steps,
            },
            suggestion=suggestion,
        )
    ]


def _measured_by_category(result: AnalysisResult, categories: List[str]) -> Dict[str, int]:
    """Path time by category over the steady steps that measured all of ``categories``."""
    totals = dict.fromkeys(categories, 0)
    for digest in result.digests(warmup=False):
        if all(c in digest.measured for c in categories):
            split = digest.by_category
            for category in categories:
                totals[category] += split[category]
    return totals
