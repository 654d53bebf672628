"""The ``slow_replica`` rule: one device of a process (MirroredStrategy's replicas, or a
MultiWorkerMirroredStrategy worker's GPUs) reaching the step's collectives late.

Usage::

    findings = slow_replica_findings(result)

A collective of several replicas in one process is one collective span, from its last
replica's arrival (``record.ATTR_REPLICAS``); it says which replica came last
(``ATTR_REPLICA_LAST``) and how long after the first (``ATTR_REPLICA_SPREAD_NS``). Per rank and
steady step, the worst spread of its collectives is that replica's lateness; the run's own
spreads give the noise, as for ranks (``tf_otel.lateness``: median + 5 robust sigmas, at least
MIN_REPLICA_LATE_NS), and the step must be longer than the typical one by what passes the
noise (``StragglerNoise.delayed``). The time a late replica costs is on the step's path before
the collective (compute or its input on that device), not communication. As for ranks, the
late steps make a finding when they cost >= 2 % of the steady time or are >= 10 % of the steps.
"""

from __future__ import annotations

import statistics
from typing import Dict, List, Tuple

from tf_otel import record
from tf_otel.analysis.result import AnalysisResult, Finding
from tf_otel.analysis.rules.finding_figures import MAX_LISTED_STEPS, ms, severity, straggles_enough
from tf_otel.lateness import noise_of

MIN_REPLICA_LATE_NS = 1_000_000  # a replica's lateness below this is noise on any host


def replica_lateness(result: AnalysisResult) -> Dict[int, List[Tuple[int, Dict[int, int]]]]:
    """rank -> [(step key, {replica: lateness ns}), ...] over the steady steps whose collectives
    carry replica spreads (each step: the last replica of its widest spread; the others 0)."""
    out: Dict[int, List[Tuple[int, Dict[int, int]]]] = {}
    for step in result.steps_with(lambda d: d.replicas, warmup=False):
        worst = step.facts.replica_worst  # rank -> (spread, replica, replicas)
        for rank, (spread, last, replicas) in worst.items():
            lateness = {r: 0 for r in range(max(replicas, last + 1))}
            lateness[last] = max(0, spread)
            out.setdefault(rank, []).append((step.key, lateness))
    return out


def slow_replica_findings(result: AnalysisResult) -> List[Finding]:
    findings = []
    digests = result.digests()
    durations = [d.duration_ns for d in digests if not d.warmup]
    typical = int(statistics.median(durations)) if durations else 0
    total = sum(durations) or 1
    for rank, steps in sorted(replica_lateness(result).items()):
        noise = noise_of([lateness for _, lateness in steps], MIN_REPLICA_LATE_NS)
        late: Dict[int, List[Tuple[int, int]]] = {}  # replica -> [(step key, ns)]
        for key, lateness in steps:
            replica = max(lateness, key=lambda r: (lateness[r], -r))
            over = digests[key].duration_ns - typical
            # late beyond the noise, and the step longer for it (as ranks are judged)
            if lateness[replica] > noise.threshold_for(replica) and noise.delayed(over):
                late.setdefault(replica, []).append((key, lateness[replica]))
        for replica, where in sorted(late.items()):
            extra = sum(ns for _, ns in where)
            # as for ranks: one hiccup in a long run is no finding
            if not straggles_enough(extra / total, len(where) / len(steps)):
                continue
            worst = max(ns for _, ns in where)
            labels = [result.step_label(key) for key, _ in where]
            findings.append(
                Finding(
                    rule="slow_replica",
                    severity=severity(extra / (result.total_ns or 1)),
                    summary=(
                        f"replica {replica} of rank {rank} reached its collectives late in "
                        f"{len(where)} steps (step {', '.join(labels[:5])}"
                        f"{', ...' if len(labels) > 5 else ''}), by up to {ms(worst)} ms"
                    ),
                    evidence={
                        "rank": rank,
                        "replica": replica,
                        "steps": [result.step_number(key) for key, _ in where][:MAX_LISTED_STEPS],
                        "lateness_ms": [ms(ns) for _, ns in where][:MAX_LISTED_STEPS],
                        "threshold_ms": ms(noise.threshold_for(replica)),
                        "steps_with_replicas": len(steps),
                        "source": (
                            f"collective spans' {record.ATTR_REPLICA_LAST} / "
                            f"{record.ATTR_REPLICA_SPREAD_NS}"
                        ),
                    },
                    suggestion=(
                        "One device of this process is late to the all-reduce and every other "
                        "device waits for it: check that device's load (other processes on the "
                        "GPU, its clocks and temperature), an uneven per-replica batch, or "
                        "per-replica Python work (tf.numpy_function / py_function) in the step."
                    ),
                )
            )
    return findings
