"""Run the whole analysis, step by step.

Usage::

    result = analyze_spans(spans, source="traces/", step_range=(10, 20))
    result = analyze_source(load_spilled(["traces/"]), source="traces/")   # bounded memory

Two passes over the traces: the first builds every step and keeps only its extent, its step
spans and last collectives (``StepTrace.slim``), enough to order the steps and match each with
the one before it; the second reads each selected step's spans again, finds its critical path
and what the rules need (``step_facts``, ``stragglers.keep_for_statistics``), and slims it.
Once no step left to analyse carries from a step, its last collectives go too
(``StepTrace.strip``). The statistics over all steps and the rules then read those few values
per step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional, Tuple, TypeVar, Union

from tf_otel.analysis.carry import Previous, carried_into, previous_steps
from tf_otel.analysis.causality import CausalityRepair, repair_trace_causality
from tf_otel.analysis.critical_path import critical_path
from tf_otel.analysis.engine import Engine, InProcess
from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.findings import evaluate_rules
from tf_otel.analysis.gc_pause import paused_gc
from tf_otel.analysis.gpu import gpu_utilisation
from tf_otel.analysis.load.progress import Progress
from tf_otel.analysis.measured import measured_categories
from tf_otel.analysis.model import Span
from tf_otel.analysis.outliers import step_outliers
from tf_otel.analysis.result import AnalysisResult, StepResult
from tf_otel.analysis.step_facts import step_facts
from tf_otel.analysis.steps import StepTrace, build_step, select_steps, step_order
from tf_otel.analysis.stragglers import keep_for_statistics, straggler_summary, warmup_keys
from tf_otel.analysis.trace_source import MemorySource, TraceSource

StepRange = Tuple[Optional[int], Optional[int]]
T = TypeVar("T")


def analyze_source(
    traces: Union[TraceSource, List[Span]],
    source: str = "",
    job_id: Optional[str] = None,
    step_range: Optional[StepRange] = None,
    start_ns: Optional[int] = None,
    end_ns: Optional[int] = None,
    straggler_min_share: float = 0.0,
    straggler_min_ns: int = 1_000_000,
    *,
    progress: Optional[bool] = False,
    engine: Optional[Engine] = None,
    keep_segments: bool = True,
) -> AnalysisResult:
    """The analysis of ``traces`` (a source, or spans held in memory); ``engine`` runs its
    passes' batches (default: this process); ``keep_segments``: False keeps each step's path
    totals only (what every report but ``--with-path`` reads)."""
    if isinstance(traces, list):
        if not traces:
            raise AnalysisError(f"{source or 'input'}: no spans")
        traces = MemorySource(traces)
    steps = _Steps(
        traces, _chosen_job(traces, job_id), straggler_min_share, straggler_min_ns, engine
    )
    steps.keep_segments = keep_segments
    with paused_gc():
        return _analyze(
            steps,
            source,
            job_id,
            step_range,
            start_ns,
            end_ns,
            straggler_min_share,
            straggler_min_ns,
            progress,
        )


analyze_spans = analyze_source  # spans in a list: the same analysis, its options the same


def _chosen_job(traces: TraceSource, job_id: Optional[str]) -> Optional[str]:
    """``job_id``, checked; without it the input must hold at most one job."""
    jobs = traces.job_ids()
    if job_id is None:
        if len(jobs) > 1:
            listed = ", ".join(sorted(jobs)[:10])
            raise AnalysisError(
                f"the traces hold {len(jobs)} jobs ({listed}): choose one with --job"
            )
        return None
    if job_id not in jobs:
        raise AnalysisError(f"no spans of job {job_id!r} in the input")
    return job_id


class _Steps:
    """Steps built from the source's traces: the job's spans only, causality repaired."""

    def __init__(
        self,
        traces: TraceSource,
        job_id: Optional[str],
        min_share: float,
        min_ns: int,
        engine: Optional[Engine] = None,
    ) -> None:
        self.traces, self.job_id = traces, job_id
        self.engine: Engine = engine or InProcess()
        self.min_share, self.min_ns = min_share, min_ns  # the straggler floors
        self.keep_segments = True  # False: each path keeps its totals only (drop_segments)
        self.repair = CausalityRepair()
        self.previous: Dict[str, Previous] = {}

    def build(self, trace_id: str, warnings: List[str], first: bool) -> Optional[StepTrace]:
        spans = self.traces.spans(trace_id)
        if self.job_id is not None:
            spans = [s for s in spans if s.job_id == self.job_id]
        if first or self.traces.fresh:  # the same objects are repaired once
            repair = repair_trace_causality({trace_id: spans})
            if first:
                self.add_repair(repair)
        return build_step(trace_id, spans, warnings)

    def add_repair(self, repair: CausalityRepair) -> None:
        self.repair.violations += repair.violations
        self.repair.traces += repair.traces
        self.repair.max_shift_ns = max(self.repair.max_shift_ns, repair.max_shift_ns)

    def analysed(self, key: int, outline: StepTrace) -> StepResult:
        """The step ``outline`` analysed from its spans (read again where it was slimmed), then
        slimmed."""
        trace = outline if not outline.slimmed else self.build(outline.trace_id, [], False)
        if trace is None:  # pragma: no cover - the source changed between the passes
            raise AnalysisError(f"trace {outline.trace_id}: its spans changed while analysed")
        path = critical_path(trace, carried_into(trace, self.previous.get(trace.trace_id)))
        result = StepResult(key, trace, path, measured_categories(trace), facts=step_facts(trace))
        keep_for_statistics(path, self.min_share, self.min_ns)
        if not self.keep_segments:
            path.drop_segments()
        trace.slim()
        if outline.slimmed:  # the outline is this slim step already: keep one of the two
            result.trace = path.step = outline
        return result

    def with_spans(self, step: StepResult) -> StepResult:
        """``step`` again with its spans (built anew; the same path)."""
        trace = self.build(step.trace.trace_id, [], False)
        if trace is None:  # pragma: no cover - the source changed between the passes
            return step
        previous = self.previous.get(trace.trace_id)
        if previous is not None:  # a stripped step carries nothing: read it again too
            evidence = previous.evidence
            previous = Previous(self._whole(previous.trace), evidence and self._whole(evidence))
        carried = carried_into(trace, previous)
        return replace(step, trace=trace, path=critical_path(trace, carried))

    def _whole(self, trace: StepTrace) -> StepTrace:
        """``trace`` itself, or built anew where it was stripped (``StepTrace.strip``)."""
        if not trace.stripped:
            return trace
        return self.build(trace.trace_id, [], False) or trace


BATCHES_PER_WORKER = 8  # enough to even out the workers, few enough to keep tasks cheap


def _batches(items: List[T], workers: int) -> List[List[T]]:
    """``items`` in order, cut into batches: one item each in one process."""
    size = 1 if workers <= 1 else max(1, -(-len(items) // (workers * BATCHES_PER_WORKER)))
    return [items[i : i + size] for i in range(0, len(items), size)]


def outline_batch(
    task: Tuple[TraceSource, Optional[str], List[str]],
) -> Tuple[List[StepTrace], List[str], CausalityRepair]:
    """The first pass on a batch of traces (an engine's piece of work): their steps, slimmed
    where the source reads them again, the warnings building them gave, and the repairs."""
    traces, job_id, trace_ids = task
    steps = _Steps(traces, job_id, 0.0, 0)
    built: List[StepTrace] = []
    warnings: List[str] = []
    for trace_id in trace_ids:
        step = steps.build(trace_id, warnings, True)
        if step is not None:
            if traces.fresh:  # its spans are read again when it is analysed
                step.slim()
            built.append(step)
    return built, warnings, steps.repair


def analyse_batch(
    task: Tuple[
        TraceSource,
        Optional[str],
        Tuple[float, int, bool],
        List[Tuple[int, StepTrace, Optional[Previous]]],
    ],
) -> List[StepResult]:
    """The second pass on a batch of steps (an engine's piece of work): each analysed, with
    the step before it (``carry.previous_steps``), then slimmed."""
    traces, job_id, (min_share, min_ns, keep_segments), items = task
    steps = _Steps(traces, job_id, min_share, min_ns)
    steps.keep_segments = keep_segments
    results = []
    for key, outline, previous in items:
        if previous is not None:
            steps.previous[outline.trace_id] = previous
        results.append(steps.analysed(key, outline))
    return results


def _analyze(
    steps: _Steps,
    source: str,
    job_id: Optional[str],
    step_range: Optional[StepRange],
    start_ns: Optional[int],
    end_ns: Optional[int],
    straggler_min_share: float,
    straggler_min_ns: int,
    progress: Optional[bool],
) -> AnalysisResult:
    warnings: List[str] = []
    all_steps: List[StepTrace] = []
    traces, engine = steps.traces, steps.engine
    trace_ids = sorted(traces.trace_ids())
    batches = _batches(trace_ids, engine.workers)
    tasks = ((traces.view(batch), steps.job_id, batch) for batch in batches)
    with Progress("building steps", len(trace_ids), progress) as bar:
        for (built, batch_warnings, repair), batch in zip(
            engine.map(outline_batch, tasks), batches
        ):
            all_steps.extend(built)
            warnings.extend(batch_warnings)
            steps.add_repair(repair)
            bar.advance(len(batch))
    all_steps.sort(key=step_order)
    repair = steps.repair
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
    steps.previous = previous_steps(all_steps)
    results: List[StepResult] = []
    options = (steps.min_share, steps.min_ns, steps.keep_segments)
    items = [
        (key, outline, steps.previous.get(outline.trace_id)) for key, outline in enumerate(selected)
    ]
    groups = _batches(items, engine.workers)
    tasks2 = (
        (traces.view([outline.trace_id for _, outline, _ in group]), steps.job_id, options, group)
        for group in groups
    )
    # the later steps' carry reads each step's collectives; once read, they go (``strip``)
    readers = _readers(items)
    with Progress("analysing steps", len(selected), progress) as bar:
        for analysed, group in zip(engine.map(analyse_batch, tasks2), groups):
            for result, (_, outline, previous) in zip(analysed, group):
                if outline.slimmed:  # a worker's copy of this slim step: keep one
                    result.trace = result.path.step = outline
                for read in _read_by(outline, previous):
                    readers[read.trace_id] -= 1
                    if not readers[read.trace_id]:
                        read.strip()
            results.extend(analysed)
            bar.advance(len(group))
    # the analysed steps' slim traces are their outlines (one copy); the others go
    steps.previous = {
        r.trace.trace_id: steps.previous[r.trace.trace_id]
        for r in results
        if r.trace.trace_id in steps.previous
    }
    del selected, items, groups, all_steps
    return _summarise(
        results, steps, source, job_id, warnings, straggler_min_share, straggler_min_ns
    )


def _read_by(outline: StepTrace, previous: Optional[Previous]) -> List[StepTrace]:
    """The steps whose collectives analysing ``outline`` reads: itself, and its previous and
    evidence steps."""
    read = [outline]
    if previous is not None:
        read.append(previous.trace)
        if previous.evidence is not None:
            read.append(previous.evidence)
    return read


def _readers(items: List[Tuple[int, StepTrace, Optional[Previous]]]) -> Dict[str, int]:
    """Trace id -> how many of ``items``' analyses read that step."""
    readers: Dict[str, int] = {}
    for _, outline, previous in items:
        for read in _read_by(outline, previous):
            readers[read.trace_id] = readers.get(read.trace_id, 0) + 1
    return readers


def _summarise(
    results: List[StepResult],
    steps: _Steps,
    source: str,
    job_id: Optional[str],
    warnings: List[str],
    straggler_min_share: float,
    straggler_min_ns: int,
) -> AnalysisResult:
    """The statistics over all steps and the findings (spans read again only for a rare
    straggler step, ``stragglers.keep_for_statistics``)."""
    warmup = warmup_keys({r.key: r.trace.duration_ns for r in results})
    for key in warmup:
        results[key].warmup = True
    stragglers = straggler_summary(
        {r.key: r.path for r in results},
        straggler_min_share,
        straggler_min_ns,
        warmup,
        lambda key: steps.with_spans(results[key]).path,
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
            (sample for r in results for sample in r.facts.gpu_samples),
            (t.step_span for r in results for t in r.trace.ranks.values() if t.step_span),
        ),
        warnings=warnings,
        reload=steps.with_spans,
    )
    result.findings = evaluate_rules(result)
    return result
