"""GPU utilisation samples carried by spans, per rank: ``hw.gpu.utilization`` (the semconv name,
the step's mean that rank step spans carry) or the older ``gpu.utilization``.

Usage::

    samples = gpu_utilisation(spans, step_spans)   # {rank: [percent, ...]}; {} when no GPU
"""

from __future__ import annotations

from operator import attrgetter
from typing import Dict, Iterable, List

from tf_otel.analysis.model import ATTR_GPU_UTILIZATION, Span
from tf_otel.record import ATTR_HW_GPU_UTILIZATION

__all__ = ["ATTR_GPU_UTILIZATION", "gpu_utilisation"]

_GPU = attrgetter("gpu_utilization")


def gpu_utilisation(
    spans: Iterable[Span], step_spans: Iterable[Span] = ()
) -> Dict[int, List[float]]:
    """Samples as percentages; when every sample is <= 1 they are fractions and are scaled.
    ``spans``: every span (the older per-span attribute); ``step_spans``: the ranks' step spans,
    the only ones that carry ``hw.gpu.utilization`` (looked at alone: cheap)."""
    samples: Dict[int, List[float]] = {}
    spans = list(spans)
    found = [(s, s.attributes.get(ATTR_HW_GPU_UTILIZATION)) for s in step_spans]
    found = [(s, v) for s, v in found if v is not None]
    if not found and list(map(_GPU, spans)).count(None) == len(spans):
        return samples  # no GPU metrics (the common case): no Python loop over all spans
    pairs = found or [(s, s.gpu_utilization) for s in spans]  # decoded at load
    for span, value in pairs:
        if value is None or span.rank is None or isinstance(value, bool):
            continue
        try:
            samples.setdefault(span.rank, []).append(float(value))
        except (TypeError, ValueError):
            continue
    # hw.gpu.utilization is a ratio by convention; the older attribute: ratios when all are <= 1
    if samples and (found or max(max(values) for values in samples.values()) <= 1.0):
        samples = {rank: [v * 100.0 for v in values] for rank, values in samples.items()}
    return dict(sorted(samples.items()))
