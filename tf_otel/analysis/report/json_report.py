"""The ``--format json`` document (schema in docs/guides/ANALYSIS.md; ``schema_version`` 2).

Usage::

    document = to_json(result, with_path=False)
    json.dumps(document)

Durations are milliseconds (floats, exact to the nanosecond); absolute times are integer ns
since the Unix epoch; rank keys of objects are strings (JSON).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Dict

from tf_otel.analysis.compare.profile import run_profile
from tf_otel.analysis.measured import NOT_MEASURED, CategoryShare
from tf_otel.analysis.report import ms
from tf_otel.analysis.result import AnalysisResult, StepResult

# 2: a category not measured is null, not 0, and shares are over the steps that measured it
SCHEMA_VERSION = 2


def _ms(ns: float) -> float:
    return ms(ns, 6)


def _step(step: StepResult, with_path: bool) -> Dict[str, Any]:
    trace = step.trace
    ends = {rank: timeline.end_ns for rank, timeline in trace.ranks.items()}
    last_end = max(ends.values())
    document: Dict[str, Any] = {
        "step": trace.step,
        "trace_id": trace.trace_id,
        "start_ns": trace.start_ns,
        "duration_ms": _ms(trace.duration_ns),
        "critical_path_ms": _ms(step.path.length_ns),
        "ranks": sorted(trace.ranks),
        "missing_ranks": trace.missing_ranks,
        "world_size": len(trace.expected_ranks),  # the world that ran it (Horovod Elastic)
        "last_rank_to_end": min(r for r, end in ends.items() if end == last_end),
        # null: not measured in this step (the setting is in not_measured)
        "critical_path_by_category_ms": {
            category: _ms(value) if category in step.measured else None
            for category, value in step.path.by_category().items()
        },
        "not_measured": step.not_measured,
        "critical_path_by_rank_ms": {
            str(rank): _ms(value) for rank, value in step.path.by_rank().items()
        },
        "straggler": None,
        "what_if_ms": _ms(step.what_if_ns),
        "outlier": step.outlier,
        "warmup": step.warmup,
    }
    if step.series is not None:  # a step of another step function than the job's main one
        document["series"] = step.series
    if step.straggler is not None:
        document["straggler"] = {
            "rank": step.straggler.rank,
            "excess_ms": _ms(step.straggler.excess_ns),
            "saving_ms": _ms(step.straggler.saving_ns),
            "category": step.straggler.category,
            "delay_ms": _ms(
                min(
                    step.straggler.excess_ns,
                    step.straggler.excess_by_category_ns.get(step.straggler.category, 0),
                )
            ),
            "excess_by_category_ms": {
                c: _ms(v) for c, v in step.straggler.excess_by_category_ns.items()
            },
        }
    if with_path:
        document["path"] = [
            {
                "rank": segment.rank,
                "start_ns": segment.start_ns,
                "end_ns": segment.end_ns,
                "category": segment.category,
                "name": segment.name,
                "span_id": segment.span_id,
            }
            for segment in step.path.segments
        ]
    return document


def _category(found: CategoryShare) -> Dict[str, Any]:
    """One category over the steady steps: measured on all, some or none of them."""
    if not found.measured:
        status = NOT_MEASURED
    else:
        status = "measured" if found.measured_steps == found.steps else "partly measured"
    document: Dict[str, Any] = {
        "status": status,
        "measured_steps": found.measured_steps,
        "steps": found.steps,
        "share": None if found.share is None else round(found.share, 4),
        "critical_path_ms": _ms(found.ns) if found.measured else None,
    }
    if found.setting:
        document["setting"] = found.setting
    if found.holds:
        document["holds_not_measured"] = list(found.holds)
        document["holds_steps"] = found.holds_steps
    return document


def to_json(result: AnalysisResult, with_path: bool = False) -> Dict[str, Any]:
    shares = result.category_shares()
    durations = sorted(d.duration_ns for d in result.digests(warmup=False))
    warmup = result.digests(warmup=True)
    noise = result.stragglers.noise
    path_by_rank = result.by_rank()
    ranks = []
    for stats in result.stragglers.ranks.values():
        ranks.append(
            {
                "rank": stats.rank,
                "steps": stats.steps,
                "straggler_steps": [result.step_number(k) for k in stats.straggler_steps],
                "straggler_excess_ms": _ms(stats.excess_ns),
                "what_if_saving_ms": _ms(stats.saving_ns),
                "collectives": stats.collectives,
                "last_arrivals": stats.last_arrivals,
                "mean_arrival_lateness_ms": _ms(
                    stats.arrival_lateness_ns / stats.last_arrivals if stats.last_arrivals else 0
                ),
                "last_to_end": stats.last_to_end,
                "mean_end_lateness_ms": _ms(
                    stats.end_lateness_ns / stats.last_to_end if stats.last_to_end else 0
                ),
                "critical_path_ms": _ms(path_by_rank.get(stats.rank, 0)),
            }
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "source": result.source,
        "job_id": result.job_id,
        "summary": {
            "steps": len(result.steps),
            "ranks": result.ranks(),
            "total_ms": _ms(result.total_ns),
            "median_step_ms": _ms(result.outliers.median_ns),
            "min_step_ms": _ms(durations[0]) if durations else 0.0,
            "max_step_ms": _ms(durations[-1]) if durations else 0.0,
            "what_if_total_ms": _ms(result.what_if_total_ns),
            "what_if_saving_ms": _ms(result.total_ns - result.what_if_total_ns),
            # null: measured on no steady step; shares over the steps that measured each
            "critical_path_ms": {
                c: _ms(found.ns) if found.measured else None for c, found in shares.items()
            },
            "critical_path_share": {
                c: None if found.share is None else round(found.share, 4)
                for c, found in shares.items()
            },
            "categories": {c: _category(found) for c, found in shares.items()},
            "warmup_steps": [d.step for d in warmup],
            "warmup_ms": _ms(sum(d.duration_ns for d in warmup)),
            "straggler_threshold_ms": _ms(noise.threshold_ns),
            **_what_if(result),
            **_overlaps(result),
            "lateness_noise": {
                "center_ms": _ms(noise.center_ns),
                "sigma_ms": _ms(noise.sigma_ns),
                "samples": noise.samples,
            },
        },
        "steps": [_step(step, with_path) for step in result.steps],
        "profile": run_profile(result),  # what tf-otel diff compares
        "ranks": ranks,
        "outliers": {
            "median_ms": _ms(result.outliers.median_ns),
            "mad_ms": _ms(result.outliers.mad_ns),
            "threshold_ms": _ms(result.outliers.threshold_ns),
            "steps": [result.step_number(k) for k in result.outliers.outliers],
        },
        "findings": [asdict(finding) for finding in result.findings],
        "warnings": list(result.warnings),
    }


def _what_if(result: AnalysisResult) -> Dict[str, Any]:
    """The ranks and groups slow throughout and the run's saving without each (only where
    there are some: otherwise nothing is added, so a report without them keeps its keys)."""
    run = result.what_if
    if not run.subjects:
        return {}
    steady = sum(d.duration_ns for d in result.digests(warmup=False)) or 1
    return {
        "slow_throughout": [
            {
                "ranks": list(subject.ranks),
                "label": subject.label,
                "work_ratio": round(subject.ratio, 3),
                "what_if_saving_ms": _ms(run.saving_ns.get(subject, 0)),
                "what_if_saving_share": round(run.saving_ns.get(subject, 0) / steady, 4),
            }
            for subject in run.subjects
        ]
    }


def _overlaps(result: AnalysisResult) -> Dict[str, Any]:
    """How often the path took a sync span that overlapped its rank's next op within the
    tolerance, and passed one running beyond it (only where it did)."""
    within = sum(d.overlaps[0] for d in result.digests())
    beyond = sum(d.overlaps[1] for d in result.digests())
    if not within and not beyond:
        return {}
    return {"path_overlaps": {"within_tolerance": within, "concurrent": beyond}}
