"""Findings: rules over an ``AnalysisResult``, each with evidence and a suggestion.

Usage::

    result.findings = evaluate_rules(result)

In the spirit of SageMaker Debugger's profiler rules. Thresholds (module constants):
- straggler: a rank is the step straggler in >= 1 step and its what-if saving is >= 2% of the
  total step time or it straggles in >= 10% of the steps;
- communication_bound: communication + straggler wait >= 30% of the critical path over the
  steps where communication was measured (none: no finding; ``path_share``);
- a straggler's cause ``compute`` on a step that did not measure input or communication holds
  them too: the finding says so (no claim of pure compute);
- persistent_lateness: a rank whose median lateness (over the steady steps) stands out from
  the ranks' step-to-step variation: late in most steps, so measured against itself per step;
  with the run's what-if (``what_if``: the steps replayed without its excess);
- slow_group: ranks slow together throughout (``what_if.slow_subjects``), named once with
  what they share and their own what-if;
- step_outliers: at least one step above median + 3.5 robust sigmas (see ``outliers``).
The other rules live where their data is read, one module a rule or a family:
- input_bound (``input_rule``): the step spans' input wait graded as the TF profiler does, or
  where step spans carry none, input wait >= 15% of the critical path;
- low_gpu_utilization (``gpu_rule``): a rank's GPU utilisation p95 < 70%, from step spans or
  else other spans;
- the whole-step rules (input source, CPU, time between steps, memory growth, batch size) from
  step span attributes: ``step_rules``.
Severity: high when the time at stake is >= 10% of the total, medium >= 3%, else low
(``finding_figures.severity``).
"""

from __future__ import annotations

from typing import Dict, List, Optional

from tf_otel.analysis.compare.what_if import HOST_ATTRIBUTE, MIN_SAVING_SHARE, Subject
from tf_otel.analysis.measured import holds_text
from tf_otel.analysis.path.critical_path import (
    PATH_CATEGORIES,
    PATH_COMMUNICATION,
    PATH_COMPUTE,
    PATH_STRAGGLER_WAIT,
)
from tf_otel.analysis.result import AnalysisResult, Finding
from tf_otel.analysis.rules.finding_figures import (
    MAX_LISTED_STEPS,
    STRAGGLER_MIN_SAVING_SHARE,
    ms,
    severity,
    straggles_enough,
)
from tf_otel.analysis.rules.gpu_rule import low_gpu_findings
from tf_otel.analysis.rules.input_rule import input_bound_findings
from tf_otel.analysis.rules.path_share import path_share_findings
from tf_otel.analysis.rules.replica_rule import slow_replica_findings
from tf_otel.analysis.rules.step_rules import whole_step_findings
from tf_otel.analysis.rules.whole_step import step_samples

COMMUNICATION_BOUND_SHARE = 0.30


def _ordered(settings: Dict[str, str]) -> Dict[str, str]:
    return {c: settings[c] for c in PATH_CATEGORIES if c in settings}


def straggler_findings(result: AnalysisResult) -> List[Finding]:
    findings = []
    total = sum(d.duration_ns for d in result.digests(warmup=False)) or 1
    # steps where the rank was late together with others: named once, as their group
    together = {
        (rank, key)
        for subject in result.what_if.subjects
        for rank in subject.ranks
        for key in subject.steps
    }
    for stats in result.stragglers.ranks.values():
        count = len(stats.straggler_steps)
        if not count or all((stats.rank, key) in together for key in stats.straggler_steps):
            continue
        saving_share = stats.saving_ns / total
        step_share = count / max(1, len(result.steady_steps))
        if not straggles_enough(saving_share, step_share):
            continue
        numbers = [result.step_number(key) for key in stats.straggler_steps]
        causes: Dict[str, int] = {}
        held: Dict[str, str] = {}  # not measured where compute is named the cause
        for key in stats.straggler_steps:
            category = result.steps[key].straggler.category  # type: ignore[union-attr]
            causes[category] = causes.get(category, 0) + 1
            if category == PATH_COMPUTE:
                held.update(result.steps[key].not_measured)
        cause = ", ".join(sorted(causes, key=lambda c: -causes[c]))
        if held:  # the cause "compute" then holds them too: say so, claim no pure compute
            cause += f"; its compute holds {holds_text(held)}: not measured"
        findings.append(
            Finding(
                rule="straggler",
                severity=severity(saving_share),
                summary=(
                    f"rank {stats.rank} is the straggler in {count} of "
                    f"{len(result.steady_steps)} steady steps,"
                    f" {ms(stats.excess_ns / count)} ms behind the median rank on average"
                    f" (cause: {cause})"
                ),
                evidence={
                    "rank": stats.rank,
                    "steps": numbers[:MAX_LISTED_STEPS],
                    "step_count": count,
                    "mean_excess_ms": ms(stats.excess_ns / count),
                    "what_if_saving_ms": ms(stats.saving_ns),
                    "what_if_saving_share": round(saving_share, 4),
                    "causes": dict(sorted(causes.items())),
                    "threshold_ms": ms(result.stragglers.noise.threshold_for(stats.rank)),
                    "last_arrivals": stats.last_arrivals,
                    "collectives": stats.collectives,
                    "last_to_end": stats.last_to_end,
                    **({"compute_holds_not_measured": _ordered(held)} if held else {}),
                },
                suggestion=(
                    "Look at what this rank does before its late collectives (the legs on the "
                    "critical path): an uneven data shard or input pipeline, a slower or shared "
                    "host (CPU contention, thermal throttling, another job), or rank-specific work "
                    "(logging, checkpointing on rank 0). Balance the work or move it off the step."
                ),
            )
        )
    return findings


def persistent_findings(result: AnalysisResult) -> List[Finding]:
    """A rank late in most steps (the noise model's, or slow throughout by its own work: the
    run's what-if), and ranks slow together as one group (``what_if``)."""
    noise = result.stragglers.noise
    run = result.what_if
    steady_total = sum(d.duration_ns for d in result.digests(warmup=False)) or 1
    persistent = noise.persistent()
    grouped = {
        r
        for subject in run.subjects
        if len(subject.ranks) > 1 and not subject.steps
        for r in subject.ranks
    }
    findings = []
    steady = max(1, len(result.steady_steps))
    for subject in run.subjects:
        if len(subject.ranks) < 2:
            continue
        saving_share = run.saving_ns.get(subject, 0) / steady_total
        if subject.steps and not straggles_enough(saving_share, len(subject.steps) / steady):
            continue  # late together, but too rarely and too little to report
        findings.append(_group_finding(result, subject, steady_total))
    singles = {s.ranks[0]: s for s in run.subjects if len(s.ranks) == 1}
    for rank in sorted(set(persistent) | set(singles)):
        if rank in grouped:
            continue
        single = singles.get(rank)
        saving = run.saving_ns.get(single) if single is not None else None
        share = saving / steady_total if saving is not None else None
        usual = persistent.get(rank)
        if share is not None and share < (
            # late by the shape of its work (a pipeline's first stage): slowing nobody
            MIN_SAVING_SHARE if usual is not None else STRAGGLER_MIN_SAVING_SHARE
        ):
            continue  # late, but the step replayed without its excess is no shorter
        if usual is not None:
            behind = f"median {ms(usual)} ms behind the other ranks"
            at_stake = usual * len(result.steady_steps) / steady_total
        else:
            assert single is not None  # a rank slow by its own work is a subject
            behind = f"its own work {single.ratio:.2f}x the other ranks'"
            at_stake = 0.0
        at_stake = share if share is not None else at_stake
        what_if = f"; the run {_pct(share)} shorter without its excess" if share else ""
        findings.append(
            Finding(
                rule="persistent_lateness",
                severity=severity(at_stake),
                summary=f"rank {rank} is late in most steps: {behind}{what_if}",
                evidence={
                    "rank": rank,
                    "median_lateness_ms": ms(usual) if usual is not None else None,
                    "threshold_ms": ms(noise.threshold_ns),
                    "noise_sigma_ms": ms(noise.sigma_ns),
                    "work_ratio": round(single.ratio, 3) if single else None,
                    "what_if_saving_ms": ms(saving) if saving is not None else None,
                    "what_if_saving_share": round(share, 4) if share is not None else None,
                },
                suggestion=(
                    "Something this rank does every step and the others do not: rank-0 duties "
                    "(logging, metrics, tracing), an uneven shard, a slower host. Its single "
                    "straggler steps are judged against this usual lateness."
                ),
            )
        )
    return findings


_GROUP_SUGGESTIONS = {
    HOST_ATTRIBUTE: (
        "These ranks share a host: look at that host's hardware and load (a slower CPU or GPU, "
        "thermal throttling, another job or process contending, a degraded link or NIC)."
    ),
    None: (
        "These ranks are slower together by the same amount: look at what they share (a "
        "host, a switch, a data shard, a pipeline stage) and balance the work across ranks."
    ),
}
_PARTITION_SUGGESTION = (
    "These ranks share {attribute}={value}: the work is not balanced across it (a pipeline "
    "stage or partition with more layers or heavier ones). Repartition so that each holds "
    "about the same compute."
)


def _group_finding(result: AnalysisResult, subject: Subject, steady_total: int) -> Finding:
    saving = result.what_if.saving_ns.get(subject, 0)
    share = saving / steady_total
    if subject.attribute is not None and subject.attribute != HOST_ATTRIBUTE:
        suggestion = _PARTITION_SUGGESTION.format(attribute=subject.attribute, value=subject.value)
    else:
        suggestion = _GROUP_SUGGESTIONS[subject.attribute]
    if subject.steps:
        numbers = [result.step_number(key) for key in subject.steps]
        how = (
            f"were late together in {len(numbers)} of {len(result.steady_steps)} steady steps, "
            f"by {ms(subject.late_ns)} ms (median)"
        )
    else:
        numbers = []
        how = (
            f"are slow together in most steps: their own work {subject.ratio:.2f}x the other ranks'"
        )
    return Finding(
        rule="slow_group",
        severity=severity(share),
        summary=f"{subject.label} {how}; the run {_pct(share)} shorter without their excess",
        evidence={
            "ranks": list(subject.ranks),
            "shared": {subject.attribute: subject.value} if subject.attribute else {},
            "work_ratio": round(subject.ratio, 3),
            "steps": numbers[:MAX_LISTED_STEPS],
            "median_lateness_ms": ms(subject.late_ns) if subject.steps else None,
            "what_if_saving_ms": ms(saving),
            "what_if_saving_share": round(share, 4),
        },
        suggestion=suggestion,
    )


def _pct(share: Optional[float]) -> str:
    return f"{100 * (share or 0):.1f} %"


_HOROVOD_REMEDIES = (
    "larger HOROVOD_FUSION_THRESHOLD, fp16 gradient compression (hvd.Compression.fp16), "
    "gradient accumulation / larger batches, hierarchical allreduce"
)
_TF_REMEDIES = (
    "tf.distribute.experimental.CommunicationOptions (bytes_per_pack to overlap the packs with "
    "the backward pass, NCCL on GPUs), fp16 gradients, gradient accumulation / larger batches"
)


def _collective_libraries(result: AnalysisResult) -> List[str]:
    """Whose collectives the job ran (span names "horovod.<op> ..." / "tensorflow.<op> ...")."""
    return sorted(set().union(*(d.libraries for d in result.digests())))


def communication_findings(result: AnalysisResult) -> List[Finding]:
    libraries = _collective_libraries(result)
    remedies = [_TF_REMEDIES if lib == "tensorflow" else _HOROVOD_REMEDIES for lib in libraries]
    return path_share_findings(
        result,
        "communication_bound",
        [PATH_COMMUNICATION, PATH_STRAGGLER_WAIT],
        COMMUNICATION_BOUND_SHARE,
        what="communication",
        suggestion=(
            f"Reduce or hide communication: {'; '.join(remedies or [_HOROVOD_REMEDIES])}; "
            "check the interconnect (NCCL over InfiniBand, not TCP)."
        ),
    )


def outlier_findings(result: AnalysisResult) -> List[Finding]:
    stats = result.outliers
    if not stats.outliers:
        return []
    durations = {key: result.steps[key].trace.duration_ns for key in stats.outliers}
    extra = sum(d - stats.median_ns for d in durations.values())
    worst = max(durations, key=lambda key: (durations[key], -key))
    return [
        Finding(
            rule="step_outliers",
            severity=severity(extra / (result.total_ns or 1)),
            summary=(
                f"{len(durations)} steps take longer than {ms(stats.threshold_ns)} ms "
                f"(median {ms(stats.median_ns)} ms); worst: step {result.step_label(worst)} "
                f"({ms(durations[worst])} ms)"
            ),
            evidence={
                "steps": [result.step_number(k) for k in stats.outliers][:MAX_LISTED_STEPS],
                "step_count": len(durations),
                "median_ms": ms(stats.median_ns),
                "mad_ms": ms(stats.mad_ns),
                "threshold_ms": ms(stats.threshold_ns),
                "extra_ms": ms(extra),
            },
            suggestion=(
                "Compare an outlier step's critical path with a typical one (--html): the first "
                "steps trace and compile functions; periodic ones point at checkpoints, "
                "evaluation, logging or garbage collection; random ones at the host or network."
            ),
        )
    ]


def evaluate_rules(result: AnalysisResult) -> List[Finding]:
    """Every rule, ordered by severity (stable: equal severities keep this order)."""
    samples = step_samples(result)  # one pass over the step spans for every rule that reads them
    findings = straggler_findings(result)
    findings += persistent_findings(result)
    findings += slow_replica_findings(result)
    findings += communication_findings(result)
    findings += outlier_findings(result)
    findings += input_bound_findings(result, samples)
    findings += low_gpu_findings(result, samples)
    findings += whole_step_findings(samples)
    order = {"high": 0, "medium": 1, "low": 2}
    return sorted(findings, key=lambda f: order[f.severity])
