"""GPU utilisation samples carried by spans (attribute ``gpu.utilization``), per rank.

Usage::

    samples = gpu_utilisation(spans)   # {rank: [percent, ...]}; {} when no GPU metrics
"""

from __future__ import annotations

from operator import attrgetter
from typing import Dict, Iterable, List

from tf_otel.analysis.model import ATTR_GPU_UTILIZATION, Span

__all__ = ["ATTR_GPU_UTILIZATION", "gpu_utilisation"]

_GPU = attrgetter("gpu_utilization")


def gpu_utilisation(spans: Iterable[Span]) -> Dict[int, List[float]]:
    """Samples as percentages; when every sample is <= 1 they are fractions and are scaled."""
    samples: Dict[int, List[float]] = {}
    spans = list(spans)
    if list(map(_GPU, spans)).count(None) == len(spans):
        return samples  # no GPU metrics (the common case): no Python loop over all spans
    for span in spans:
        value = span.gpu_utilization  # attribute gpu.utilization, decoded at load
        if value is None or span.rank is None or isinstance(value, bool):
            continue
        try:
            samples.setdefault(span.rank, []).append(float(value))
        except (TypeError, ValueError):
            continue
    if samples and max(max(values) for values in samples.values()) <= 1.0:
        samples = {rank: [v * 100.0 for v in values] for rank, values in samples.items()}
    return dict(sorted(samples.items()))
