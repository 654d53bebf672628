"""The ``input_bound`` rule: is the job waiting for its input? One rule, two sources; it takes
the better one the trace has.

Usage::

    from tf_otel.analysis.rules.whole_step import step_samples
    findings = input_bound_findings(result, step_samples(result))
    ranks = input_bound_ranks(samples)   # the graded ranks, for io_bound / decode_bound_input

- Step spans carry the input wait (``tf_otel.input.wait_ns``, on by default): graded as the TF
  profiler does, per rank over the steady steps that are not step outliers: wait >= 5 % of step
  time *moderately* (medium), >= 20 % *highly* (high); and >= 0.2 ms a batch in the median step
  (the timing tail's own floor is ~0.05 ms a batch) or >= 1 ms a batch on average.
- Otherwise (older traces, input wait off): input wait >= 15 % of the critical path over the
  steady steps where input was measured (``path_share``; measured on none: no finding).

Thresholds and their anchors: docs/guides/WHOLE_STEP.md ("Findings") and docs/guides/ANALYSIS.md.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from tf_otel.analysis.path.critical_path import PATH_INPUT
from tf_otel.analysis.result import AnalysisResult, Finding
from tf_otel.analysis.rules.finding_figures import median, ms, ranks_text
from tf_otel.analysis.rules.path_share import path_share_findings
from tf_otel.analysis.rules.whole_step import MIN_STEPS, StepSample, by_rank

INPUT_MODERATE_SHARE = 0.05  # the TF profiler: "moderately input-bound"
INPUT_HIGH_SHARE = 0.20  # "highly input-bound"
# a batch, median step: the timing tail's floor (docs/guides/WHOLE_STEP.md)
INPUT_MIN_WAIT_NS = 200_000
INPUT_MIN_MEAN_WAIT_NS = 1_000_000  # a batch on average, where the median step waits less
INPUT_PATH_SHARE = 0.15  # of the critical path, where step spans carry no input wait


def input_bound_findings(result: AnalysisResult, samples: Sequence[StepSample]) -> List[Finding]:
    """``input_bound`` from the step spans' own input wait where any carries it (it times every
    wait, on every step), else from the input on the critical path. ``samples``: the result's
    ``step_samples``, passed in as every step rule reads the same ones."""
    if any(s.input_wait_ns is not None for s in samples):
        return _graded_findings(samples)
    return path_share_findings(
        result,
        "input_bound",
        [PATH_INPUT],
        INPUT_PATH_SHARE,
        what="input wait",
        suggestion=(
            "Overlap input with compute: dataset.prefetch(tf.data.AUTOTUNE), "
            "map(num_parallel_calls=AUTOTUNE), interleave for file reads, cache() small "
            "datasets, move decoding off the host's critical cores."
        ),
    )


def _input_stats(samples: Sequence[StepSample]) -> Optional[Dict[str, float]]:
    # outlier steps (a stalled host, a checkpoint) are the step_outliers finding's; one 1 s
    # stall would otherwise halve the share of a run of 30 ms steps
    timed = [s for s in samples if s.input_wait_ns is not None and not s.outlier]
    if len(timed) < MIN_STEPS:
        return None
    wait = sum(s.input_wait_ns or 0 for s in timed)
    duration = sum(s.duration_ns for s in timed) or 1
    elements = sum(s.input_elements or 0 for s in timed)
    return {
        "steps": len(timed),
        "share": wait / duration,
        "wait_ns": wait,
        "wait_per_step_ns": wait / len(timed),
        # the typical step: a step the scheduler stalled lets the wait run long (or the
        # prefetch buffer fill), which moves the mean but not this
        "median_wait_per_step_ns": median([s.input_wait_ns or 0 for s in timed]),
        "median_wait_per_batch_ns": median(
            [(s.input_wait_ns or 0) / max(1, s.input_elements or 1) for s in timed]
        ),
        "wait_per_batch_ns": wait / elements if elements else wait / len(timed),
        "step_ns": duration / len(timed),
    }


def input_bound_ranks(samples: Sequence[StepSample]) -> Dict[int, Dict[str, float]]:
    """Ranks whose input wait passes the moderate grade and the noise floor, with their figures."""
    found = {}
    for rank, own in by_rank(samples).items():
        stats = _input_stats(own)
        if stats is None:
            continue
        # above the timing tail's floor in the typical step, or well above it on average (waits
        # in some steps only: file boundaries, a refilling shuffle buffer); a loaded host's
        # scheduler hiccups lift the mean of a prefetched pipeline (0.26 ms a batch measured at
        # load 16 on 2 cores), not its median
        typical = stats["median_wait_per_batch_ns"] >= INPUT_MIN_WAIT_NS
        sporadic = stats["wait_per_batch_ns"] >= INPUT_MIN_MEAN_WAIT_NS
        if stats["share"] >= INPUT_MODERATE_SHARE and (typical or sporadic):
            found[rank] = stats
    return found


def _graded_findings(samples: Sequence[StepSample]) -> List[Finding]:
    """The TF profiler's grades over the step spans' ``tf_otel.input.wait_ns``."""
    ranks = input_bound_ranks(samples)
    if not ranks:
        return []
    worst = max(ranks, key=lambda r: (ranks[r]["share"], -r))
    share = ranks[worst]["share"]
    grade = "highly" if share >= INPUT_HIGH_SHARE else "moderately"
    return [
        Finding(
            rule="input_bound",
            severity="high" if grade == "highly" else "medium",
            summary=(
                f"{grade} input-bound: waiting for input is {share:.0%} of the step time on "
                f"{ranks_text(list(ranks))} ({ms(ranks[worst]['wait_per_step_ns'])} ms a step)"
            ),
            evidence={
                "grade": grade,
                "share": round(share, 4),
                "thresholds": {
                    "moderately": INPUT_MODERATE_SHARE,
                    "highly": INPUT_HIGH_SHARE,
                    "min_median_wait_per_batch_ms": ms(INPUT_MIN_WAIT_NS),
                    "min_mean_wait_per_batch_ms": ms(INPUT_MIN_MEAN_WAIT_NS),
                },
                "by_rank": {
                    str(rank): {
                        "share": round(stats["share"], 4),
                        "wait_per_step_ms": ms(stats["wait_per_step_ns"]),
                        "median_wait_per_step_ms": ms(stats["median_wait_per_step_ns"]),
                        "wait_per_batch_ms": ms(stats["wait_per_batch_ns"]),
                        "median_wait_per_batch_ms": ms(stats["median_wait_per_batch_ns"]),
                        "step_ms": ms(stats["step_ns"]),
                        "steps": int(stats["steps"]),
                    }
                    for rank, stats in ranks.items()
                },
                "source": "step span attributes tf_otel.input.wait_ns / tf_otel.input.elements",
            },
            suggestion=(
                "Overlap input with compute: dataset.prefetch(tf.data.AUTOTUNE), "
                "map(num_parallel_calls=tf.data.AUTOTUNE), interleave for file reads, cache() "
                "what fits in memory, decode once offline; see the io_bound_input / "
                "decode_bound_input finding for which part of the pipeline to look at."
            ),
        )
    ]
