"""The run's what-if over its steady steps, as the analysis asks it: the slow ranks and groups
(``what_if.slow_subjects``), the ranks late together (``what_if.late_together``), their groups
labelled by a resource attribute read once, and the run's saving without them
(``what_if.run_what_if``, the steps' graphs read again only where there is a subject).

Usage::

    result.what_if = steady_what_if(results, digests, warmup, stragglers, graph_of, reload)
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Set

from tf_otel.analysis.compare.replay import StepGraph
from tf_otel.analysis.compare.what_if import RunWhatIf, late_together, run_what_if, slow_subjects
from tf_otel.analysis.path.critical_path import PATH_COMMUNICATION
from tf_otel.analysis.result import StepDigest, StepResult
from tf_otel.analysis.stragglers import StragglerSummary


def steady_what_if(
    results: Sequence[StepResult],
    digests: List[StepDigest],
    warmup: Set[int],
    stragglers: StragglerSummary,
    graph_of: Callable[[int], Optional[StepGraph]],
    reload: Callable[[StepResult], StepResult],
    group_by: Optional[str] = None,
) -> RunWhatIf:
    """Ranks and groups slow throughout the steady steps, and the run's saving without them;
    the steps are read again only where there are some (``graph_of``: a step's dependency
    graph, read again; ``reload``: a slim step with its spans). ``warmup``: the keys left out
    (``digests`` were made before the marks)."""
    steady = [key for key in range(len(digests)) if key not in warmup]
    # own work is told from waiting only in a step with sync spans (communication measured)
    synced = [k for k in steady if digests[k].work_ns and PATH_COMMUNICATION in digests[k].measured]
    persistent = stragglers.noise.persistent()
    subjects = slow_subjects((digests[key].work() for key in synced), persistent)
    named = {key: (s.rank, s.saving_ns) for key, s in stragglers.step_stragglers.items()}
    lateness = {key: digests[key].lateness() for key in named}
    ranks_of = {key: s.rank for key, s in stragglers.step_stragglers.items()}
    threshold = stragglers.noise.threshold_for
    together = late_together(lateness, ranks_of, threshold)
    # groups are labelled by a resource attribute their ranks share: read once, for them all
    grouped = {r for subject in subjects if len(subject.ranks) > 1 for r in subject.ranks}
    grouped |= {r for subject in together for r in subject.ranks}
    if grouped:
        labels = rank_resources(results, steady, grouped, reload)
        if any(len(subject.ranks) > 1 for subject in subjects):
            work = (digests[key].work() for key in synced)
            subjects = slow_subjects(work, persistent, labels, group_by)
        if together:
            together = late_together(lateness, ranks_of, threshold, labels, group_by)
    return run_what_if(graph_of, steady, subjects + together, named)


def rank_resources(
    results: Sequence[StepResult],
    steady: List[int],
    ranks: Set[int],
    reload: Callable[[StepResult], StepResult],
) -> Dict[int, Dict[str, str]]:
    """Each of ``ranks``' resource attributes, from the first steady steps that hold them
    (read again with their spans: a slim step's spans have no resource)."""
    found: Dict[int, Dict[str, str]] = {}
    for key in steady[:8]:
        step = results[key]
        trace = step.trace if not step.trace.slimmed else reload(step).trace
        for rank, timeline in trace.ranks.items():
            span = timeline.step_span
            if rank in ranks and rank not in found and span is not None and span.resource:
                found[rank] = {k: str(v) for k, v in span.resource.items()}
        if ranks <= found.keys():
            break
    return found
