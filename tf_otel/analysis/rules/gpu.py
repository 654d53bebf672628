"""GPU utilisation samples carried by spans, per rank: ``hw.gpu.utilization`` (the semconv name,
the step's mean that rank step spans carry) or the older ``gpu.utilization``.

Usage::

    samples = gpu_utilisation(span_samples, step_spans)  # {rank: [percent, ...]}; {} if no GPU
    samples = job_gpu_utilisation(steps, digests)        # the same over a job's analysed steps
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from tf_otel.analysis.model import ATTR_GPU_UTILIZATION, Span
from tf_otel.analysis.result import StepDigest, StepResult, steps_where
from tf_otel.record import ATTR_HW_GPU_UTILIZATION

__all__ = ["ATTR_GPU_UTILIZATION", "gpu_utilisation", "job_gpu_utilisation"]


def gpu_utilisation(
    span_samples: Iterable[Tuple[Optional[int], Any]], step_spans: Iterable[Span] = ()
) -> Dict[int, List[float]]:
    """Samples as percentages; when every sample is <= 1 they are fractions and are scaled.
    ``span_samples``: (rank, value) of every span carrying the older per-span attribute
    (``step_facts``); ``step_spans``: the ranks' step spans, the only ones that carry
    ``hw.gpu.utilization``, which win where any does."""
    samples: Dict[int, List[float]] = {}
    values = [(s.rank, s.attributes.get(ATTR_HW_GPU_UTILIZATION)) for s in step_spans]
    found = [(rank, value) for rank, value in values if value is not None]
    pairs = found or list(span_samples)
    for rank, value in pairs:
        if value is None or rank is None or isinstance(value, bool):
            continue
        try:
            samples.setdefault(rank, []).append(float(value))
        except (TypeError, ValueError):
            continue
    # hw.gpu.utilization is a ratio by convention; the older attribute: ratios when all are <= 1
    if samples and (found or max(max(values) for values in samples.values()) <= 1.0):
        samples = {rank: [v * 100.0 for v in values] for rank, values in samples.items()}
    return dict(sorted(samples.items()))


def job_gpu_utilisation(
    steps: Sequence[StepResult], digests: Sequence[StepDigest]
) -> Dict[int, List[float]]:
    """``gpu_utilisation`` over a job's analysed steps: only the steps whose digest says they
    carry GPU samples are read (steps on disk are read one at a time)."""
    return gpu_utilisation(
        (
            sample
            for r in steps_where(steps, digests, _has_gpu_spans)
            for sample in r.facts.gpu_samples
        ),
        (
            t.step_span
            for r in steps_where(steps, digests, _has_gpu_step_spans)
            for t in r.trace.ranks.values()
            if t.step_span
        ),
    )


def _has_gpu_spans(digest: StepDigest) -> bool:
    return digest.gpu_spans


def _has_gpu_step_spans(digest: StepDigest) -> bool:
    return digest.gpu_step_spans
