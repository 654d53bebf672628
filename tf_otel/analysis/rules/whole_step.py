"""The whole-step attributes of step spans (input wait, time between steps, I/O, CPU, memory,
GPU, batch size) as plain per-step samples for the rules that read them (``step_rules``,
``input_rule``, ``gpu_rule``).

Usage::

    samples = step_samples(result)          # steady steps only, one sample per rank and step
    samples = [sample_of(span, rank) ...]   # or from step spans directly
    for rank, own in by_rank(samples).items(): ...   # a rank judged on >= MIN_STEPS of them

The attributes' names are in ``step_attributes``. A missing attribute is None: traces from older
versions, other OSes or with input wait off simply give the rules less to judge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tf_otel.analysis.model import Span, as_int
from tf_otel.record import (
    ATTR_BATCH_SIZE,
    ATTR_BETWEEN,
    ATTR_CALLBACK,
    ATTR_CHECKPOINT,
    ATTR_CPU_TIME,
    ATTR_CPUS,
    ATTR_DETAIL,
    ATTR_HW_GPU_UTILIZATION,
    ATTR_INPUT_ELEMENTS,
    ATTR_INPUT_WAIT,
    ATTR_MEMORY,
    ATTR_READ_BYTES,
    ATTR_READ_OPS,
    ATTR_TOP,
)

MIN_STEPS = 5  # per rank: the fewest samples any rule judges a rank on


@dataclass(frozen=True)
class StepSample:
    """One rank's step span, reduced to what the whole-step rules read."""

    rank: int
    step: Optional[int]
    duration_ns: int
    between_ns: Optional[int] = None  # previous step end -> this step begin (same thread)
    callback_ns: Optional[int] = None
    checkpoint_ns: Optional[int] = None
    top: Tuple[Tuple[str, float], ...] = ()  # (name, ms) of the slowest things between steps
    input_wait_ns: Optional[int] = None
    input_elements: Optional[int] = None
    read_bytes: Optional[int] = None
    read_ops: Optional[int] = None
    cpu_time_ns: Optional[int] = None  # since the previous step end
    cpus: Optional[int] = None
    rss_bytes: Optional[int] = None
    gpu_percent: Optional[float] = None
    batch_size: Optional[int] = None
    outlier: bool = False  # a step_outliers step (a stall): kept out of the input share
    # tf_otel traced ops or sampled resources in it: its own reads and CPU are in the counters
    detail: bool = False

    @property
    def wall_ns(self) -> int:
        """Previous step end -> this step end: the span the per-step deltas cover."""
        return self.duration_ns + (self.between_ns or 0)


def _top(value: Any) -> Tuple[Tuple[str, float], ...]:
    """``["Stall=100.3ms", ...]`` (OTLP array) or its string form (Jaeger) -> pairs."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.strip("[]").replace('"', "").replace("'", "").split(",")
    pairs = []
    for item in value:
        name, _, amount = str(item).strip().rpartition("=")
        try:
            pairs.append((name, float(amount.removesuffix("ms"))))
        except ValueError:
            continue
    return tuple(pair for pair in pairs if pair[0])


def _number(value: Any) -> Optional[float]:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def sample_of(span: Span, rank: int, outlier: bool = False) -> StepSample:
    attributes: Dict[str, Any] = span.attributes
    # hw.gpu.utilization is a ratio by convention; the older gpu.utilization was a ratio from
    # NVML and a percentage in older spans, told apart by size
    gpu = _number(attributes.get(ATTR_HW_GPU_UTILIZATION))
    if gpu is not None:
        gpu_percent: Optional[float] = gpu * 100.0
    else:
        gpu = _number(span.gpu_utilization)
        gpu_percent = None if gpu is None else gpu * 100.0 if gpu <= 1.0 else gpu
    return StepSample(
        rank=rank,
        step=span.step,
        duration_ns=span.duration_ns,
        between_ns=as_int(attributes.get(ATTR_BETWEEN)),
        callback_ns=as_int(attributes.get(ATTR_CALLBACK)),
        checkpoint_ns=as_int(attributes.get(ATTR_CHECKPOINT)),
        top=_top(attributes.get(ATTR_TOP)),
        input_wait_ns=as_int(attributes.get(ATTR_INPUT_WAIT)),
        input_elements=as_int(attributes.get(ATTR_INPUT_ELEMENTS)),
        read_bytes=as_int(attributes.get(ATTR_READ_BYTES)),
        read_ops=as_int(attributes.get(ATTR_READ_OPS)),
        cpu_time_ns=as_int(attributes.get(ATTR_CPU_TIME)),
        cpus=as_int(attributes.get(ATTR_CPUS)),
        rss_bytes=as_int(attributes.get(ATTR_MEMORY)),
        gpu_percent=gpu_percent,
        batch_size=as_int(attributes.get(ATTR_BATCH_SIZE)),
        outlier=outlier,
        detail=bool(attributes.get(ATTR_DETAIL)),
    )


def step_samples(result: Any) -> List[StepSample]:
    """One sample per rank and steady step of an ``AnalysisResult`` (warm-up steps left out),
    ordered by rank then step."""
    samples = []
    for step in result.steady_steps:
        for rank, timeline in step.trace.ranks.items():
            if timeline.step_span is not None:
                samples.append(sample_of(timeline.step_span, rank, step.outlier))
    samples.sort(key=lambda s: (s.rank, s.step if s.step is not None else -1))
    return samples


def by_rank(samples: Sequence[StepSample]) -> Dict[int, List[StepSample]]:
    """The samples of each rank, ranks in order (each rank's samples in the order given)."""
    ranks: Dict[int, List[StepSample]] = {}
    for sample in samples:
        ranks.setdefault(sample.rank, []).append(sample)
    return dict(sorted(ranks.items()))
