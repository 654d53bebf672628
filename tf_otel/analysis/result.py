"""What one analysis produced: per-step results, cross-step summaries and findings.

Usage::

    result.steps[0].measured            # the path categories that step measured
    result.category_shares()["input"]   # its share over the steady steps that measured it
    result.by_category()                # ns on the path by category (0 where not measured)
"""

from __future__ import annotations

import re
import sys
from array import array
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple

from tf_otel.analysis.compare.what_if import RunWhatIf
from tf_otel.analysis.measured import (
    ALWAYS_MEASURED,
    CategoryShare,
    category_shares,
    group_share,
    not_measured,
)
from tf_otel.analysis.outliers import OutlierStats
from tf_otel.analysis.path.critical_path import PATH_CATEGORIES, CriticalPath
from tf_otel.analysis.step_facts import StepFacts
from tf_otel.analysis.steps import StepTrace
from tf_otel.analysis.stragglers import StepStraggler, StragglerSummary
from tf_otel.record import ATTR_HW_GPU_UTILIZATION


@dataclass
class StepResult:
    key: int  # index in the selection
    trace: StepTrace
    path: CriticalPath
    # the path categories whose source was on in this step (measured.measured_categories);
    # the default claims only what step spans always give
    measured: FrozenSet[str] = ALWAYS_MEASURED
    straggler: Optional[StepStraggler] = None
    outlier: bool = False
    warmup: bool = False  # a leading step still tracing / compiling: kept out of statistics
    facts: StepFacts = field(default_factory=StepFacts)  # what the rules read of its spans
    # a step of another step function than the job's main one (a TF1 program's other
    # Session.run fetch sets, Keras evaluate beside fit): its short name, else None
    series: Optional[str] = None

    @property
    def label(self) -> str:
        return step_label(self.trace.step, self.series, self.key)

    @property
    def not_measured(self) -> Dict[str, str]:
        """Category -> the setting that measures it, for what this step did not measure."""
        return not_measured(self.measured)

    @property
    def what_if_ns(self) -> int:
        return what_if_ns(self.trace.duration_ns, self.straggler)


def step_label(number: Optional[int], series: Optional[str], key: int) -> str:
    """A step's label: its number (``#key`` without one), after its series where it has one."""
    text = str(number) if number is not None else f"#{key}"
    return f"{series}:{text}" if series else text


def what_if_ns(duration_ns: int, straggler: Optional[StepStraggler]) -> int:
    """The step's duration had its straggler not been late."""
    saving = straggler.saving_ns if straggler else 0
    return min(duration_ns, max(0, duration_ns - saving))


@dataclass(frozen=True)
class StepMarks:
    """What the statistics over all steps mark a step with (``analyze._summarise``)."""

    warmup: bool
    series: Optional[str]  # set where the step is not of the job's main series
    straggler: Optional[StepStraggler]
    outlier: bool

    def put_on(self, step: StepResult) -> None:
        step.warmup, step.straggler, step.outlier = self.warmup, self.straggler, self.outlier
        if self.series is not None:
            step.series = self.series


@dataclass(frozen=True)
class StepDigest:
    """What the sums over all steps read of one analysed step: a few hundred bytes and 8 a
    rank (its lateness), kept in memory for steps kept on disk (``step_store.PagedSteps``), so
    that the reports' sums and filters do not read every step back again and again."""

    duration_ns: int
    what_if_ns: int
    by_category: Dict[str, int]
    by_rank: Dict[int, int]
    measured: FrozenSet[str]
    ranks: Tuple[int, ...]
    warmup: bool
    series: Optional[str]  # step_series
    step: Optional[int]  # trace.step
    job_id: Optional[str]  # trace.job_id
    missing_ranks: Tuple[int, ...]  # trace.missing_ranks
    unattributed: bool  # path.unattributed_waits
    libraries: FrozenSet[str]  # facts.libraries
    # which steps a report's pass over the steps needs to read back (the others have none)
    replicas: bool  # facts.replica_worst: a collective's replica spread
    gpu_spans: bool  # facts.gpu_samples: spans with the older per-span GPU attribute
    gpu_step_spans: bool  # a rank's step span with hw.gpu.utilization
    # path.lateness_by_rank(), which the noise model reads of every steady step: its ranks and
    # values apart (8 bytes a rank; equal rank tuples are one object in ``PagedSteps``)
    lateness_ranks: Tuple[int, ...]
    lateness_ns: array[int]
    # the ranks' own work in the step (``replay.own_work``), by rank in sorted order; empty
    # where it was not taken
    work_ns: array[int] = field(default_factory=lambda: array("q"))
    overlaps: Tuple[int, int] = (0, 0)  # path.overlaps, path.concurrent
    names: Tuple[Tuple[str, str, int], ...] = ()  # path.by_name(): (category, name, ns)

    def lateness(self) -> Dict[int, int]:
        """``path.lateness_by_rank()``."""
        return dict(zip(self.lateness_ranks, self.lateness_ns))

    def work(self) -> Dict[int, int]:
        """Each rank's own work in the step (``replay.own_work``)."""
        return dict(zip(sorted(self.ranks), self.work_ns))


SERIES_CHARS = 24  # a series' short name in labels
_ROOT_NAME = re.compile(r"(.+) step -?[0-9]+")


def step_series(trace: StepTrace) -> Optional[str]:
    """The step function a step belongs to, from its root's name (``<step key> step <n>``,
    runtime/exporter.py), shortened: the part after the kind (``session_run:global_step`` ->
    ``global_step``). None without a root named so (older files: "step <n>")."""
    found = _ROOT_NAME.fullmatch(trace.root.name) if trace.root is not None else None
    if found is None:
        return None
    key = found.group(1)
    name = key.split(":", 1)[-1] or key
    return name if len(name) <= SERIES_CHARS else name[: SERIES_CHARS - 1] + "…"


def step_digest(step: StepResult) -> StepDigest:
    lateness = step.path.lateness_by_rank()
    return StepDigest(
        step.trace.duration_ns,
        step.what_if_ns,
        step.path.by_category(),
        step.path.by_rank(),
        step.measured,
        tuple(step.trace.ranks),
        step.warmup,
        sys.intern(series) if (series := step_series(step.trace)) else None,
        step.trace.step,
        step.trace.job_id,
        tuple(step.trace.missing_ranks),
        step.path.unattributed_waits > 0,
        step.facts.libraries,
        bool(step.facts.replica_worst),
        bool(step.facts.gpu_samples),
        any(
            t.step_span is not None
            and t.step_span.attributes.get(ATTR_HW_GPU_UTILIZATION) is not None
            for t in step.trace.ranks.values()
        ),
        tuple(lateness),
        array("q", lateness.values()),
        step.path.work if step.path.work is not None else array("q"),
        (step.path.overlaps, step.path.concurrent),
        step.path.by_name(),
    )


def steps_where(
    steps: Sequence[StepResult], digests: Sequence[StepDigest], flag: Callable[[StepDigest], bool]
) -> Iterator[StepResult]:
    """The steps whose digest has ``flag``, in order, read one at a time: a pass over the steps
    for what few of them hold reads only those from disk."""
    for key, digest in enumerate(digests):
        if flag(digest):
            yield steps[key]


def digests_of(steps: Sequence[StepResult]) -> List[StepDigest]:
    """The steps' digests: kept in memory by steps on disk (``step_store.PagedSteps``), else
    made."""
    kept = getattr(steps, "digests", None)
    digests = kept() if kept is not None else [step_digest(step) for step in steps]
    return _rootless_in_their_series(digests)


def _rootless_in_their_series(digests: List[StepDigest]) -> List[StepDigest]:
    """Steps without a root (rank 0, which writes the roots, has gone: a killed or departed
    rank 0) have no series of their own: where the job has one step function they are its
    steps, so a rank's last step and the world of each step are read in one series."""
    named = {d.series for d in digests if d.series is not None}
    if len(named) != 1 or all(d.series is not None for d in digests):
        return digests
    (series,) = named
    return [d if d.series is not None else replace(d, series=series) for d in digests]


@dataclass
class Finding:
    rule: str  # straggler, input_bound, communication_bound, step_outliers, low_gpu_utilization
    severity: str  # high, medium, low
    summary: str
    evidence: Dict[str, Any]
    suggestion: str


@dataclass
class AnalysisResult:
    source: str
    job_id: Optional[str]
    steps: Sequence[StepResult]  # a list, or read from disk a step at a time (step_store)
    stragglers: StragglerSummary
    outliers: OutlierStats
    gpu_utilization: Dict[int, List[float]] = field(default_factory=dict)
    findings: List[Finding] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    # the step again with its spans (``trace.slimmed`` steps have none): for the pictures
    reload: Optional[Callable[[StepResult], StepResult]] = field(default=None, repr=False)
    # ranks and groups slow throughout the run, and what the run saves without them
    what_if: RunWhatIf = field(default_factory=RunWhatIf)

    def with_spans(self, step: StepResult) -> StepResult:
        """``step`` with its op spans, for drawing it."""
        if not step.trace.slimmed or self.reload is None:
            return step
        return self.reload(step)

    def digests(self, warmup: Optional[bool] = None) -> List[StepDigest]:
        """Each step's digest (those with this warm-up mark where given), from memory where
        the steps are on disk."""
        found = digests_of(self.steps)
        return found if warmup is None else [d for d in found if d.warmup == warmup]

    @property
    def total_ns(self) -> int:
        return sum(digest.duration_ns for digest in self.digests())

    @property
    def what_if_total_ns(self) -> int:
        """The run's length without its step stragglers' and slow subjects' excess."""
        steps = sum(digest.what_if_ns for digest in self.digests())
        return max(0, steps - self.what_if.beyond_steps_ns)

    def steps_with(
        self, flag: Callable[[StepDigest], bool], warmup: Optional[bool] = None
    ) -> Iterator[StepResult]:
        """The steps (those with this warm-up mark where given) whose digest has ``flag``."""
        return steps_where(
            self.steps,
            digests_of(self.steps),
            lambda d: (warmup is None or d.warmup == warmup) and flag(d),
        )

    @property
    def steady_steps(self) -> Sequence[StepResult]:
        return _marked(self.steps, False)

    @property
    def warmup_steps(self) -> Sequence[StepResult]:
        return _marked(self.steps, True)

    def by_category(self) -> Dict[str, int]:
        """Critical path time by category over the steady steps (warm-up kept out); a category
        not measured on a step adds 0 there: shares come from ``category_shares``."""
        totals = dict.fromkeys(PATH_CATEGORIES, 0)
        for digest in self.digests(warmup=False):
            for category, value in digest.by_category.items():
                totals[category] += value
        return totals

    def category_shares(self) -> Dict[str, CategoryShare]:
        """Each category's share over the steady steps where it was measured (``measured``)."""
        return category_shares([(d.by_category, d.measured) for d in self.digests(warmup=False)])

    def group_share(self, categories: List[str]) -> CategoryShare:
        """Several categories' share together, over the steady steps that measured them all."""
        return group_share(
            [(d.by_category, d.measured) for d in self.digests(warmup=False)], categories
        )

    def by_rank(self) -> Dict[int, int]:
        totals: Dict[int, int] = {}
        for digest in self.digests(warmup=False):
            for rank, value in digest.by_rank.items():
                totals[rank] = totals.get(rank, 0) + value
        return dict(sorted(totals.items()))

    def step_label(self, key: int) -> str:
        return self.steps[key].label

    def step_number(self, key: int) -> Optional[int]:
        kept = getattr(self.steps, "digest", None)  # steps on disk: from memory
        return kept(key).step if kept is not None else self.steps[key].trace.step

    def ranks(self) -> List[int]:
        seen: Set[int] = set()
        for digest in self.digests():
            seen.update(digest.ranks)
        return sorted(seen)


def _marked(steps: Sequence[StepResult], warmup: bool) -> Sequence[StepResult]:
    """The steps whose warm-up mark is ``warmup``; steps on disk (``step_store.PagedSteps``)
    keep their marks in memory and are read only when asked for."""
    where = getattr(steps, "where", None)
    if where is not None:
        return where(warmup)
    return [step for step in steps if step.warmup == warmup]
