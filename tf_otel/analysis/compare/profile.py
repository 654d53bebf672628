"""A run's profile: what ``tf-otel diff`` compares of a run, small enough to keep in a report.

Usage::

    profile = run_profile(result)          # a dict: also ``analyze --format json``'s "profile"
    profile["step_ms"]["median"], profile["by_category"]["input"]["median_ms"]

Over the steady steps of the job's main step function: the step time (median, robust sigma,
mean, count; steps per second), the critical path by category (mean ms a step over the steps
that measured it, its step-to-step sigma; None: measured on no step), each rank's mean time on
the path, own work (time outside its syncs, over the steps that measured communication: in the
others a rank's waits are not told from its work; median and robust sigma) and lateness a step,
the names on the path (ops, collectives, gaps) by mean ms a step, and the findings by rule and
ranks. Every figure is a step's, so runs of different lengths compare; categories have their
median and robust sigma too (what the diff compares: a loaded host's long tails move a mean);
ranks are kept by number and the diff matches them by role where the worlds differ.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

from tf_otel.analysis.path.critical_path import PATH_CATEGORIES, PATH_COMMUNICATION
from tf_otel.analysis.result import AnalysisResult, StepDigest

PROFILE_VERSION = 1
MAD_TO_SIGMA = 1.4826
TOP_NAMES = 40  # names kept in a profile


def _ms(ns: float) -> float:
    return round(ns / 1e6, 6)


def _spread(values: List[float]) -> Dict[str, Any]:
    """Median, robust sigma (1.4826 x MAD), mean, sample sigma and count, in ms."""
    if not values:
        return {"median": None, "sigma": None, "mean": None, "sd": None, "n": 0}
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return {
        "median": _ms(median),
        "sigma": _ms(MAD_TO_SIGMA * mad),
        "mean": _ms(statistics.fmean(values)),
        "sd": _ms(statistics.stdev(values)) if len(values) > 1 else 0.0,
        "n": len(values),
    }


def _main_series(digests: List[StepDigest]) -> Optional[str]:
    counts: Dict[Optional[str], int] = {}
    for digest in digests:
        counts[digest.series] = counts.get(digest.series, 0) + 1
    return max(counts, key=lambda s: (counts[s], s or "")) if counts else None


def run_profile(result: AnalysisResult) -> Dict[str, Any]:
    """The profile of an analysed run (see the module docstring)."""
    every = result.digests(warmup=False)
    series = _main_series(every)
    steady = [d for d in every if d.series == series]
    durations = [float(d.duration_ns) for d in steady]
    total_s = sum(durations) / 1e9
    return {
        "version": PROFILE_VERSION,
        "series": series,
        "ranks": sorted({r for d in steady for r in d.ranks}),
        "steps": [d.step for d in steady if d.step is not None][:2]
        + [d.step for d in steady if d.step is not None][-1:],
        "step_ms": _spread(durations),
        "steps_per_s": round(len(steady) / total_s, 6) if total_s > 0 else None,
        "by_category": _by_category(steady),
        "by_rank": _by_rank(steady),
        "names": _names(steady),
        "findings": [
            {
                "rule": f.rule,
                "ranks": _finding_ranks(f.evidence),
                "severity": f.severity,
                "summary": f.summary,
            }
            for f in result.findings
        ],
    }


def _by_category(steady: List[StepDigest]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for category in PATH_CATEGORIES:
        values = [float(d.by_category.get(category, 0)) for d in steady if category in d.measured]
        spread = _spread(values)
        out[category] = {
            "median_ms": spread["median"],
            "sigma_ms": spread["sigma"],
            "mean_ms": spread["mean"],
            "sd_ms": spread["sd"],
            "measured_steps": len(values),
        }
    return out


def _by_rank(steady: List[StepDigest]) -> Dict[str, Any]:
    path: Dict[int, List[float]] = {}
    work: Dict[int, List[float]] = {}
    late: Dict[int, List[float]] = {}
    for digest in steady:
        for rank in digest.ranks:
            path.setdefault(rank, []).append(float(digest.by_rank.get(rank, 0)))
        for rank, value in digest.lateness().items():
            late.setdefault(rank, []).append(float(value))
        if PATH_COMMUNICATION in digest.measured:  # else its time outside syncs holds waits
            for rank, value in digest.work().items():
                work.setdefault(rank, []).append(float(value))
    out: Dict[str, Any] = {}
    for rank in sorted(path):
        own = _spread(work.get(rank, []))
        out[str(rank)] = {
            "path_ms": _ms(statistics.fmean(path[rank])),
            "work_ms": own["median"],
            "work_sigma_ms": own["sigma"],
            "work_steps": own["n"],
            "lateness_ms": _ms(statistics.median(late[rank])) if late.get(rank) else None,
        }
    return out


def _names(steady: List[StepDigest]) -> List[Dict[str, Any]]:
    totals: Dict[tuple, int] = {}
    for digest in steady:
        for category, name, ns in digest.names:
            totals[(category, name)] = totals.get((category, name), 0) + ns
    count = max(1, len(steady))
    ordered = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_NAMES]
    return [
        {"category": category, "name": name, "mean_ms": _ms(ns / count)}
        for (category, name), ns in ordered
    ]


def _finding_ranks(evidence: Dict[str, Any]) -> List[int]:
    if isinstance(evidence.get("ranks"), list):
        return [int(r) for r in evidence["ranks"]]
    rank = evidence.get("rank")
    return [int(rank)] if isinstance(rank, int) else []
