"""Run the whole analysis on loaded spans.

Usage::

    result = analyze_spans(spans, source="traces/", step_range=(10, 20))
"""

from __future__ import annotations

from itertools import chain
from typing import List, Optional, Tuple

from tf_otel.analysis.carry import carried_into, previous_steps
from tf_otel.analysis.causality import repair_trace_causality
from tf_otel.analysis.critical_path import critical_path
from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.findings import evaluate_rules
from tf_otel.analysis.gc_pause import paused_gc
from tf_otel.analysis.gpu import gpu_utilisation
from tf_otel.analysis.measured import measured_categories
from tf_otel.analysis.model import Span
from tf_otel.analysis.outliers import step_outliers
from tf_otel.analysis.result import AnalysisResult, StepResult
from tf_otel.analysis.steps import filter_job, group_trace_steps, select_steps, spans_by_trace
from tf_otel.analysis.stragglers import straggler_summary, warmup_keys


def analyze_spans(
    spans: List[Span],
    source: str = "",
    job_id: Optional[str] = None,
    step_range: Optional[Tuple[Optional[int], Optional[int]]] = None,
    start_ns: Optional[int] = None,
    end_ns: Optional[int] = None,
    straggler_min_share: float = 0.0,
    straggler_min_ns: int = 1_000_000,
) -> AnalysisResult:
    if not spans:
        raise AnalysisError(f"{source or 'input'}: no spans")
    with paused_gc():
        return _analyze(
            spans,
            source,
            job_id,
            step_range,
            start_ns,
            end_ns,
            straggler_min_share,
            straggler_min_ns,
        )


def _analyze(
    spans: List[Span],
    source: str,
    job_id: Optional[str],
    step_range: Optional[Tuple[Optional[int], Optional[int]]],
    start_ns: Optional[int],
    end_ns: Optional[int],
    straggler_min_share: float,
    straggler_min_ns: int,
) -> AnalysisResult:
    spans = filter_job(spans, job_id)
    traces = spans_by_trace(spans)
    repair = repair_trace_causality(traces)
    all_steps, warnings = group_trace_steps(traces)
    if repair.violations:
        warnings.append(
            f"clock: {repair.violations} collective(s) in {repair.traces} step(s) ended on one "
            f"rank before the last rank began them; shifted forward by up to "
            f"{repair.max_shift_ns / 1e3:.1f} us (controlled logical clock)"
        )
    if not all_steps:
        raise AnalysisError(f"{source or 'input'}: no step traces (no step.root or step spans)")
    selected = select_steps(all_steps, step_range, start_ns, end_ns)
    if not selected:
        raise AnalysisError(f"{source or 'input'}: no steps in the selected range")
    # matched over every step, so the first selected one still carries from the one before
    previous = previous_steps(all_steps)
    results = [
        StepResult(
            key,
            trace,
            critical_path(trace, carried_into(trace, previous.get(trace.trace_id))),
            measured_categories(trace),
        )
        for key, trace in enumerate(selected)
    ]
    warmup = warmup_keys({r.key: r.trace.duration_ns for r in results})
    for key in warmup:
        results[key].warmup = True
    stragglers = straggler_summary(
        {r.key: r.path for r in results}, straggler_min_share, straggler_min_ns, warmup
    )
    for step_result in results:
        step_result.straggler = stragglers.step_stragglers.get(step_result.key)
        missing = step_result.trace.missing_ranks
        if missing:
            warnings.append(f"step {step_result.label}: no spans from ranks {missing}")
    unattributed = [r.label for r in results if r.path.unattributed_waits and not r.warmup]
    if unattributed:
        warnings.append(
            f"{len(unattributed)} step(s) (first: {', '.join(unattributed[:5])}) waited at a "
            "collective for a rank whose arrival Horovod's response cache hid, and no rank's own "
            "work explains the wait: counted as straggler_wait, nobody blamed "
            "(TF_OTEL_HOROVOD_EXACT=1 records every arrival)"
        )
    outliers = step_outliers({r.key: r.trace.duration_ns for r in results if not r.warmup})
    for key in outliers.outliers:
        results[key].outlier = True
    job = job_id or next((r.trace.job_id for r in results if r.trace.job_id), None)
    result = AnalysisResult(
        source=source,
        job_id=job,
        steps=results,
        stragglers=stragglers,
        outliers=outliers,
        gpu_utilization=gpu_utilisation(
            chain.from_iterable(r.trace.spans for r in results),
            (t.step_span for r in results for t in r.trace.ranks.values() if t.step_span),
        ),
        warnings=warnings,
    )
    result.findings = evaluate_rules(result)
    return result
