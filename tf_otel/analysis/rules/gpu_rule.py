"""The ``low_gpu_utilization`` rule: a rank's GPU utilisation p95 below 70 % (SageMaker
Debugger's LowGPUUtilization). One rule, two sources; it takes the better one the trace has.

Usage::

    from tf_otel.analysis.rules.whole_step import step_samples
    findings = low_gpu_findings(result, step_samples(result))

- Step spans carry the step's mean utilisation (``hw.gpu.utilization``, a ratio; or the older
  ``gpu.utilization`` on the step span): per rank over its steady steps, at least 5 of them.
- Otherwise other spans' older ``gpu.utilization`` samples (``result.gpu_utilization``, percent
  or a 0-1 fraction, read at load by ``gpu``), every sample a rank has.

No GPU figures at all (the common case): no finding.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from tf_otel.analysis.result import AnalysisResult, Finding
from tf_otel.analysis.rules.finding_figures import median, ranks_text
from tf_otel.analysis.rules.whole_step import MIN_STEPS, StepSample, by_rank

LOW_GPU_P95_PERCENT = 70.0


def low_gpu_findings(result: AnalysisResult, samples: Sequence[StepSample]) -> List[Finding]:
    """``low_gpu_utilization`` from the step spans' per-step means where any carries one, else
    from the spans' samples. ``samples``: the result's ``step_samples``."""
    if any(s.gpu_percent is not None for s in samples):
        return _from_step_spans(samples)
    return _from_spans(result.gpu_utilization)


def _p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def _from_step_spans(samples: Sequence[StepSample]) -> List[Finding]:
    low = {}
    for rank, own in by_rank(samples).items():
        values = [s.gpu_percent for s in own if s.gpu_percent is not None]
        if len(values) < MIN_STEPS:
            continue
        p95 = _p95(values)
        if p95 < LOW_GPU_P95_PERCENT:
            low[rank] = {"p95_percent": round(p95, 1), "median_percent": round(median(values), 1)}
    if not low:
        return []
    evidence = {
        "by_rank": {str(r): v for r, v in low.items()},
        "threshold_p95_percent": LOW_GPU_P95_PERCENT,
        "source": "hw.gpu.utilization on the step spans (NVML, mean over the step)",
    }
    return _finding(
        ranks_text(list(low)),
        evidence,
        "Give the GPU more work per launch: a larger batch, mixed precision, XLA "
        "(jit_compile=True); if input_bound, cpu_bound or time_between_steps is "
        "raised too, fix that first: the GPU waits for the host.",
    )


def _from_spans(samples: Dict[int, List[float]]) -> List[Finding]:
    low = {}
    for rank, values in samples.items():
        p95 = _p95(values)
        if p95 < LOW_GPU_P95_PERCENT:
            low[rank] = round(p95, 1)
    if not low:
        return []
    return _finding(
        "ranks " + ", ".join(str(r) for r in low),  # "ranks" even for one: as it always said
        {"p95_percent_by_rank": {str(r): v for r, v in low.items()}},
        "Give the GPU more work per launch: a larger batch, mixed precision, XLA "
        "(jit_compile=True); if the critical path shows input or communication, fix that "
        "first.",
    )


def _finding(ranks: str, evidence: Dict[str, Any], suggestion: str) -> List[Finding]:
    return [
        Finding(
            rule="low_gpu_utilization",
            severity="medium",
            summary=f"GPU utilisation p95 below {LOW_GPU_P95_PERCENT:.0f}% on {ranks}",
            evidence=evidence,
            suggestion=suggestion,
        )
    ]
