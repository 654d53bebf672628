"""Run the whole analysis, step by step.

Usage::

    result = analyze_spans(spans, source="traces/", step_range=(10, 20))
    result = analyze_source(load_spilled(["traces/"]), source="traces/")   # bounded memory

Two passes over the traces: the first builds every step and keeps only its extent, its step
spans and last collectives (``StepTrace.slim``, an outline) and a few values to order the steps
and match each with the one before it (``carry.StepKey``); the second reads each selected step's
spans again, finds its critical path (reading the outlines of the step before it and of its
evidence step) and what the rules need (``step_facts``, ``stragglers.keep_for_statistics``), and
slims it. The statistics over all steps and the rules then read those few values per step.
In one process over spilled traces the first pass also analyses each step as it is built, with
the step before it as the steps met so far give it (``_first_pass``); once every step is
matched, those analysed with the step the match gives stand and only the others go through the
second pass (in input order, usually none).

From a source that reads the spans anew (spilled trace files), the outlines and the analysed
steps (without their collectives: ``StepTrace.strip``) wait on disk (``step_store``) and are read
back one at a time: memory holds the steps in flight and a few values a step, not the job.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import partial
from typing import (
    Any,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from tf_otel.analysis.compare.replay import StepGraph, step_graph
from tf_otel.analysis.compare.steady_what_if import steady_what_if
from tf_otel.analysis.engine import Engine, InProcess
from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.job_choice import attempt_notes, chosen_job
from tf_otel.analysis.load.progress import Progress
from tf_otel.analysis.measured import measured_categories
from tf_otel.analysis.model import Span
from tf_otel.analysis.outliers import step_outliers
from tf_otel.analysis.path.carry import PreviousStep, StepKey, carried_into, previous_keys, step_key
from tf_otel.analysis.path.causality import CausalityRepair, repair_trace_causality
from tf_otel.analysis.path.critical_path import CriticalPath, critical_path
from tf_otel.analysis.postmortem import (
    missing_after_stop,
    stopped_lines,
    stopped_ranks,
    world_changes,
)
from tf_otel.analysis.result import (
    AnalysisResult,
    StepMarks,
    StepResult,
    digests_of,
    step_label,
)
from tf_otel.analysis.rules.findings import evaluate_rules
from tf_otel.analysis.rules.gc_pause import paused_gc
from tf_otel.analysis.rules.gpu import job_gpu_utilisation
from tf_otel.analysis.skeleton import NeedSpans, skeleton_step
from tf_otel.analysis.step_facts import step_facts
from tf_otel.analysis.step_store import Paged, PagedSteps
from tf_otel.analysis.steps import StepTrace, build_step, select_steps, step_order
from tf_otel.analysis.stragglers import (
    keep_for_statistics,
    straggler_summary,
    warmup_keys,
)
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
    group_by: Optional[str] = None,
) -> AnalysisResult:
    """The analysis of ``traces`` (a source, or spans held in memory); ``engine`` runs its
    passes' batches (default: this process); ``keep_segments``: False keeps each step's path
    totals only (what every report but ``--with-path`` reads); ``group_by``: the resource
    attribute that labels a group of slow ranks before ``host.name`` (``what_if``)."""
    if isinstance(traces, list):
        if not traces:
            raise AnalysisError(f"{source or 'input'}: no spans")
        traces = MemorySource(traces)
    chosen = chosen_job(traces, job_id)
    steps = _StepAnalysis(traces, chosen, straggler_min_share, straggler_min_ns, engine)
    steps.keep_segments = keep_segments
    steps.notes = attempt_notes(traces, chosen)
    steps.group_by = group_by
    with paused_gc():
        return _analyze(
            steps,
            source,
            chosen,
            step_range,
            start_ns,
            end_ns,
            straggler_min_share,
            straggler_min_ns,
            progress,
        )


analyze_spans = analyze_source  # spans in a list: the same analysis, its options the same


class _StepAnalysis:
    """How the job's steps are built from the source's traces (the job's spans only, causality
    repaired; from skeletons where the source keeps them) and analysed, and what that gathers:
    the repairs, the options, the step before each."""

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
        self.notes: List[str] = []  # the report's first warnings (the job's other attempts)
        self.group_by: Optional[str] = None  # the attribute naming a slow group (what_if)
        self.repair = CausalityRepair()
        self.previous: Dict[str, PreviousStep] = {}  # a batch's steps (``analyze_batch``)
        # the whole selection's: trace id -> the previous and evidence steps' keys, and where
        # every step's outline is kept (``previous_of``)
        self.previous_keys: Dict[str, Tuple[StepKey, Optional[StepKey]]] = {}
        self.outlines: Sequence[StepTrace] = []
        # steps built from skeletons (``skeleton``): a spilled source, every job's spans
        self.skeletons = job_id is None and hasattr(traces, "skeleton")

    def build(self, trace_id: str, warnings: List[str], first: bool) -> Optional[StepTrace]:
        """The trace's step: from its skeleton where the source keeps one and it decides the
        step (``skeleton``), else from all its spans."""
        if self.skeletons:
            try:
                # the second pass builds only steps the first built from their skeletons
                return self._from_skeleton(trace_id, warnings, checked=not first)
            except NeedSpans:
                step = self.build_whole(trace_id, warnings, first)
                if step is not None:
                    step.whole = True  # the second pass builds it whole straight away
                return step
        return self.build_whole(trace_id, warnings, first)

    def _from_skeleton(
        self, trace_id: str, warnings: List[str], checked: bool
    ) -> Optional[StepTrace]:
        """``checked``: the skeleton needed no clock repair (the first pass found none)."""
        skeleton = self.traces.skeleton(trace_id)  # type: ignore[attr-defined]
        # a shift moves every span of a rank: the whole step is read
        if not checked and repair_trace_causality({trace_id: skeleton.spans}).violations:
            raise NeedSpans("clock repair")
        own: List[str] = []
        step = skeleton_step(trace_id, skeleton, own)
        warnings.extend(own)
        return step

    def build_whole(self, trace_id: str, warnings: List[str], first: bool) -> Optional[StepTrace]:
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
        if not outline.slimmed:
            trace: Optional[StepTrace] = outline
        elif outline.whole:
            trace = self.build_whole(outline.trace_id, [], False)
        else:
            trace = self.build(outline.trace_id, [], False)
        try:
            return self._analysed(key, outline, trace)
        except NeedSpans:  # a rank's rest read for the path could not be placed exactly
            return self._analysed(key, outline, self.build_whole(outline.trace_id, [], False))

    def analysed_now(
        self, step: StepTrace, previous: Optional[PreviousStep]
    ) -> Optional[StepResult]:
        """``step``, just built from its skeleton, analysed with the step before it as outlined
        so far; None where a rank's rest cannot be placed exactly (``NeedSpans``: the second
        pass builds it whole). Its key is set where it is kept (``PagedSteps``)."""
        if previous is not None:
            self.previous[step.trace_id] = previous
        try:
            return self._analysed(0, step, step)
        except NeedSpans:
            return None
        finally:
            self.previous.pop(step.trace_id, None)

    def _analysed(self, key: int, outline: StepTrace, trace: Optional[StepTrace]) -> StepResult:
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
        trace = self.build_whole(step.trace.trace_id, [], False)
        if trace is None:  # pragma: no cover - the source changed between the passes
            return step
        carried = carried_into(trace, self.previous_of(trace.trace_id))
        return replace(step, trace=trace, path=critical_path(trace, carried))

    def previous_of(self, trace_id: str) -> Optional[PreviousStep]:
        """The step before ``trace_id``'s and its evidence step, as outlined (read back)."""
        found = self.previous_keys.get(trace_id)
        if found is None:
            return None
        before, evidence = found
        outlines = self.outlines
        return PreviousStep(
            outlines[before.index], outlines[evidence.index] if evidence is not None else None
        )


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
    steps = _StepAnalysis(traces, job_id, 0.0, 0)
    built: List[StepTrace] = []
    warnings: List[str] = []
    for trace_id in trace_ids:
        step = steps.build(trace_id, warnings, True)
        if step is not None:
            if traces.fresh:  # its spans are read again when it is analysed
                step.slim()
            built.append(step)
    return built, warnings, steps.repair


def analyze_batch(
    task: Tuple[
        TraceSource,
        Optional[str],
        Tuple[float, int, bool],
        List[Tuple[int, StepTrace, Optional[PreviousStep]]],
    ],
) -> List[StepResult]:
    """The second pass on a batch of steps (an engine's piece of work): each analysed, with
    the step before it (``carry.previous_steps``), then slimmed."""
    traces, job_id, (min_share, min_ns, keep_segments), items = task
    steps = _StepAnalysis(traces, job_id, min_share, min_ns)
    steps.keep_segments = keep_segments
    results = []
    for key, outline, previous in items:
        if previous is not None:
            steps.previous[outline.trace_id] = previous
        results.append(steps.analysed(key, outline))
    return results


def _analyze(
    steps: _StepAnalysis,
    source: str,
    job_id: Optional[str],
    step_range: Optional[StepRange],
    start_ns: Optional[int],
    end_ns: Optional[int],
    straggler_min_share: float,
    straggler_min_ns: int,
    progress: Optional[bool],
) -> AnalysisResult:
    traces, engine = steps.traces, steps.engine
    # what loading said first (trace files' lines skipped: ``load.files.skip_note``)
    warnings: List[str] = list(getattr(traces, "load_warnings", ())) + steps.notes
    # read anew from the source (spilled), the outlines and results wait on disk: memory holds
    # a few values a step (``StepKey``), not every step of the job
    paged = traces.fresh
    where = getattr(traces, "directory", None)  # beside the spill
    outlines: Union[Paged[StepTrace], List[StepTrace]] = Paged(where) if paged else []
    keys: List[StepKey] = []
    results: Union[PagedSteps, List[StepResult]] = PagedSteps(where) if paged else []
    made: Optional[Dict[str, Tuple[int, AnalysedWith]]] = None
    # in one process over spilled traces each step is analysed as it is built (``_first_pass``)
    one_pass = steps.skeletons and engine.workers <= 1
    if one_pass and isinstance(outlines, Paged) and isinstance(results, PagedSteps):
        made = _first_pass(steps, outlines, results, keys, warnings, progress)
    else:
        _outline_pass(steps, outlines, keys, warnings, progress)
    keys.sort(key=step_order)
    repair = steps.repair
    if repair.violations:
        warnings.append(
            f"clock: {repair.violations} collective(s) in {repair.traces} step(s) ended on one "
            f"rank before the last rank began them; shifted forward by up to "
            f"{repair.max_shift_ns / 1e3:.1f} us (controlled logical clock)"
        )
    if not keys:
        raise AnalysisError(f"{source or 'input'}: no step traces (no step.root or step spans)")
    selected = select_steps(keys, step_range, start_ns, end_ns)
    if not selected:
        raise AnalysisError(f"{source or 'input'}: no steps in the selected range")
    # matched over every step, so the first selected one still carries from the one before
    steps.previous_keys, steps.outlines = previous_keys(keys), outlines
    del keys
    options = (steps.min_share, steps.min_ns, steps.keep_segments)
    # the steps the first pass analysed with the step before them that the match over all
    # steps gives are kept; the others are analysed now
    order: List[int] = []
    pending: List[Tuple[int, StepKey]] = []
    for n, key in enumerate(selected):
        at = _kept(made, key.trace_id, steps.previous_keys)
        order.append(at)
        if at < 0:
            pending.append((n, key))
    groups = _batches(pending, engine.workers)

    def task(group: List[Tuple[int, StepKey]]) -> Tuple[Any, ...]:
        items = [(n, outlines[k.index], steps.previous_of(k.trace_id)) for n, k in group]
        view = traces.view([k.trace_id for _, k in group])
        return (view, steps.job_id, options, items)

    with Progress("analysing steps", len(pending), progress and bool(pending)) as bar:
        for analysed, group in zip(engine.map(analyze_batch, map(task, groups)), groups):
            for result in analysed:
                if paged:  # kept on disk: only what the reports read
                    result.trace.strip()
                order[result.key] = len(results)
                results.append(result)
            bar.advance(len(group))
    if isinstance(results, PagedSteps) and made is not None:
        results.select(order)  # in the selection's order, those of unselected steps left out
    del selected, groups
    return _summarise(
        results, steps, source, job_id, warnings, straggler_min_share, straggler_min_ns
    )


# the step a step was analysed with in the first pass: the one before it (trace id), or None
AnalysedWith = Optional[str]


def _outline_pass(
    steps: _StepAnalysis,
    outlines: Union[Paged[StepTrace], List[StepTrace]],
    keys: List[StepKey],
    warnings: List[str],
    progress: Optional[bool],
) -> None:
    """Build every step (batches on the engine) into ``outlines`` and ``keys``."""
    traces, engine = steps.traces, steps.engine
    trace_ids = sorted(traces.trace_ids())
    batches = _batches(trace_ids, engine.workers)
    tasks = ((traces.view(batch), steps.job_id, batch) for batch in batches)
    with Progress("building steps", len(trace_ids), progress) as bar:
        for (built, batch_warnings, repair), batch in zip(
            engine.map(outline_batch, tasks), batches
        ):
            for outline in built:
                keys.append(step_key(outline, len(outlines)))
                outlines.append(outline)
            del built
            warnings.extend(batch_warnings)
            steps.add_repair(repair)
            bar.advance(len(batch))


def _first_pass(
    steps: _StepAnalysis,
    outlines: Paged[StepTrace],
    results: PagedSteps,
    keys: List[StepKey],
    warnings: List[str],
    progress: Optional[bool],
) -> Dict[str, Tuple[int, AnalysedWith]]:
    """``_outline_pass`` in this process, each step also analysed as it is built (not built
    again in a second pass) with the step before it as the steps met so far give it (in the
    source's order a step's predecessor comes first, mostly); trace id -> (where its result is
    kept, the predecessor it was analysed with). A step built whole, or whose predecessor has
    no sync spans (its evidence step may come later), is left to the second pass."""
    traces = steps.traces
    made: Dict[str, Tuple[int, AnalysedWith]] = {}
    seen: Dict[Tuple[Optional[str], int], List[StepKey]] = {}  # by (name, step number)
    collective = False  # as ``previous_keys``: nothing carried where no step has a collective
    found: Dict[str, List[str]] = {}
    trace_ids = traces.trace_ids()
    with Progress("building and analysing steps", len(trace_ids), progress) as bar:
        for trace_id in trace_ids:
            own: List[str] = []
            step = steps.build(trace_id, own, True)
            if own:
                found[trace_id] = own
            bar.advance(1)
            if step is None:
                continue
            key = step_key(step, len(outlines))
            collective = collective or key.collective
            result, assumed = None, None
            before = _met_before(key, seen, collective)
            if not step.whole and (before is None or before.sync):
                assumed = before.trace_id if before is not None else None
                previous = (
                    PreviousStep(outlines[before.index], None) if before is not None else None
                )
                result = steps.analysed_now(step, previous)
            step.slim()
            keys.append(step_key(step, len(outlines)))
            outlines.append(step)
            if key.step is not None:
                seen.setdefault((key.name, key.step), []).append(key)
            if result is not None:
                result.trace.strip()
                made[trace_id] = (len(results), assumed)
                results.append(result)
    for trace_id in sorted(found):  # as the outline batches give them: in trace id order
        warnings.extend(found[trace_id])
    return made


def _met_before(
    key: StepKey, seen: Dict[Tuple[Optional[str], int], List[StepKey]], collective: bool
) -> Optional[StepKey]:
    """The step before ``key``'s among the steps met so far, as ``previous_keys`` matches them
    over all steps (one step numbered one less with the same name, this one the only one so
    far); None: none."""
    if key.step is None or key.name is None or not collective:
        return None
    if (key.name, key.step) in seen:
        return None  # a second step with this number: neither has one
    before = seen.get((key.name, key.step - 1), [])
    return before[0] if len(before) == 1 else None


def _kept(
    made: Optional[Dict[str, Tuple[int, AnalysedWith]]],
    trace_id: str,
    matched: Dict[str, Tuple[StepKey, Optional[StepKey]]],
) -> int:
    """Where the first pass kept ``trace_id``'s result, if it was analysed with the step
    before it that the match over all steps gives (and no evidence step); else -1."""
    if made is None or trace_id not in made:
        return -1
    at, assumed = made[trace_id]
    found = matched.get(trace_id)
    if found is None:
        return at if assumed is None else -1
    before, evidence = found
    return at if evidence is None and before.trace_id == assumed else -1


class _CriticalPathsByKey(Mapping[int, CriticalPath]):
    """Step key -> its critical path, read from the analysed steps when asked."""

    def __init__(self, results: Sequence[StepResult]) -> None:
        self._results = results

    def __getitem__(self, key: int) -> CriticalPath:
        return self._results[key].path

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self._results)))

    def __len__(self) -> int:
        return len(self._results)


def _summarise(
    results: Union[PagedSteps, List[StepResult]],
    steps: _StepAnalysis,
    source: str,
    job_id: Optional[str],
    warnings: List[str],
    straggler_min_share: float,
    straggler_min_ns: int,
) -> AnalysisResult:
    """The statistics over all steps and the findings (spans read again only for a rare
    straggler step, ``stragglers.keep_for_statistics``), the steps read one at a time."""
    digests = digests_of(results)
    durations = {key: d.duration_ns for key, d in enumerate(digests)}
    warmup = warmup_keys(durations)
    # several step functions (a TF1 program's Session.run fetch sets): the steps of all but
    # the one with the most steps are labelled with theirs ("global_step:0"), numbers repeat
    series = Counter(d.series for d in digests)
    main = series.most_common(1)[0][0] if len(series) > 1 else None
    stragglers = straggler_summary(
        _CriticalPathsByKey(results),
        straggler_min_share,
        straggler_min_ns,
        warmup,
        lambda key: steps.with_spans(results[key]).path,
        lambda key: (digests[key].ranks, digests[key].lateness(), durations[key]),
    )
    skipped = set(warmup)
    outliers = step_outliers({k: d for k, d in durations.items() if k not in skipped})
    slow = set(outliers.outliers)
    unattributed: List[str] = []
    job = job_id
    stopped = stopped_ranks(digests)
    warnings.extend(world_changes(digests, main))
    warnings.extend(stopped_lines(stopped, main))
    for key, digest in enumerate(digests):  # the steps are read only where kept in memory
        marks = StepMarks(
            warmup=key in skipped,
            series=digest.series if main is not None and digest.series != main else None,
            straggler=stragglers.step_stragglers.get(key),
            outlier=key in slow,
        )
        if isinstance(results, PagedSteps):
            results.mark(key, marks)
        else:
            marks.put_on(results[key])
        label = step_label(digest.step, marks.series, key)
        missing = missing_after_stop(digest, stopped)
        if missing:
            warnings.append(f"step {label}: no spans from ranks {missing}")
        if digest.unattributed and not marks.warmup:
            unattributed.append(label)
        job = job or digest.job_id
    if unattributed:
        warnings.append(
            f"{len(unattributed)} step(s) (first: {', '.join(unattributed[:5])}) waited at a "
            "collective for a rank whose arrival was not recorded (horovod.arrival=unknown), and "
            "no rank's own work explains the wait: counted as straggler_wait, nobody blamed "
            "(Horovod's response cache hides arrivals: TF_OTEL_HOROVOD_EXACT=1 turns it off)"
        )
    result = AnalysisResult(
        source=source,
        job_id=job,
        steps=results,
        stragglers=stragglers,
        outliers=outliers,
        gpu_utilization=job_gpu_utilisation(results, digests),
        warnings=warnings,
        reload=steps.with_spans,
    )
    result.what_if = steady_what_if(
        results,
        digests,
        skipped,
        stragglers,
        partial(_graph, results, steps),
        steps.with_spans,
        steps.group_by,
    )
    result.findings = evaluate_rules(result)
    return result


def _graph(results: Sequence[StepResult], steps: _StepAnalysis, key: int) -> Optional[StepGraph]:
    """Step ``key``'s dependency graph, from its spans read again (a slim step has none)."""
    trace = steps.build_whole(results[key].trace.trace_id, [], False)
    if trace is None:  # pragma: no cover - the source changed between the passes
        return None
    carried = carried_into(trace, steps.previous_of(trace.trace_id))
    return step_graph(trace, {r: c.inherited_ns for r, c in carried.items() if c.inherited_ns})
