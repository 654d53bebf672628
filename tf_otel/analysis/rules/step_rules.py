"""Findings from the whole-step attributes of step spans: whether an input-bound rank's wait
goes to I/O or decoding, CPU-bound, time lost between steps, memory growth, a batch too small.

Usage::

    from tf_otel.analysis.rules.whole_step import step_samples
    findings = whole_step_findings(step_samples(result))

Each rule is one function, plain ``StepSample`` lists in, ``Finding`` lists out; a rule whose
attributes are absent finds nothing. Thresholds are module constants, documented with their
anchors in docs/guides/WHOLE_STEP.md ("Findings"):

- io_bound_input / decode_bound_input: for a rank that ``input_rule`` grades input-bound from its
  step spans' input wait, its median bytes read per step over its median wait per step
  (>= 10 MiB/s: the reads can account for the wait) and its CPU use (>= 50 % of its cores: the
  pipeline computes). Steps where tf_otel traced ops or sampled resources (``tf_otel.detail``)
  are left out of both, and of cpu_bound: tf_otel's own reads and CPU are in their counters.
- cpu_bound: process CPU time >= 85 % of (cores x wall time): every core busy.
- time_between_steps: time between steps >= 5 % of wall time and >= 1 ms a step, at least half
  of it callbacks / checkpoint writes (named) or >= 1 ms unnamed in >= 3 steps (recurring).
- memory_growth: RSS grows (Theil-Sen slope) >= 1 MiB / 100 steps, by >= 5 % over the run, and
  each third of the run sits higher than the one before.
- small_batch: batch size known, framework time between steps (not callbacks, not checkpoints)
  >= 25 % of wall time, and the step itself short (median <= 20 ms).

``input_bound`` and ``low_gpu_utilization`` read step span attributes too, but fall back on
other spans where step spans lack them: each is one rule in a module of its own
(``input_rule``, ``gpu_rule``).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from tf_otel.analysis.result import Finding
from tf_otel.analysis.rules.finding_figures import median, mib, ms, ranks_text
from tf_otel.analysis.rules.input_rule import input_bound_ranks
from tf_otel.analysis.rules.whole_step import MIN_STEPS, StepSample, by_rank

IO_MIN_READ_RATE = 10 * 2**20  # bytes read per second of input wait for reads to explain it
DECODE_CPU_SHARE = 0.50  # CPU use (of the cores) at which the input pipeline is computing
CPU_BOUND_SHARE = 0.85  # CPU time / (cores x wall)
CPU_HIGH_SHARE = 0.95
BETWEEN_SHARE = 0.05
BETWEEN_HIGH_SHARE = 0.20
BETWEEN_MIN_NS = 1_000_000  # a step, on average
BETWEEN_MIN_RECURRING = 3  # steps with >= 1 ms between them nobody is named for
MEMORY_MIN_STEPS = 20
MEMORY_MIN_SLOPE = 2**20 / 100  # bytes per step: 1 MiB / 100 steps
MEMORY_MIN_GROWTH = 0.05  # of the first third's RSS
SMALL_BATCH_OVERHEAD_SHARE = 0.25
SMALL_BATCH_MAX_STEP_NS = 20_000_000
_THEIL_SEN_POINTS = 200  # pairwise slopes are O(n^2): thin longer runs evenly


# -- where the input wait goes ----------------------------------------------------------------


def _cpu_share(samples: Sequence[StepSample]) -> Optional[float]:
    """The process's CPU time over (cores x wall time), over the samples that carry both."""
    timed = [s for s in samples if s.cpu_time_ns is not None and s.cpus]
    if len(timed) < MIN_STEPS:
        return None
    capacity = sum(s.wall_ns * (s.cpus or 0) for s in timed)
    return sum(s.cpu_time_ns or 0 for s in timed) / capacity if capacity else None


def input_source_findings(samples: Sequence[StepSample]) -> List[Finding]:
    """For the input-bound ranks: is the wait spent reading (I/O) or after the read (decode)?"""
    bound = input_bound_ranks(samples)
    per_rank = by_rank(samples)
    verdicts: Dict[str, Dict[int, Dict[str, object]]] = {"io": {}, "decode": {}}
    for rank, stats in bound.items():
        # tf_otel's own detail steps read files and /proc themselves: not the program's input
        own = [s for s in per_rank[rank] if s.input_wait_ns is not None and not s.detail]
        read = [s.read_bytes for s in own if s.read_bytes is not None]
        if len(read) < MIN_STEPS:
            continue  # no I/O attributes (not Linux, older runtime): nothing to decide on
        # a typical step's reads over a typical step's wait: one step that loads libraries or
        # a cache (6 MiB in step 1 of a GPU job) must not make every wait a read
        waits = [s.input_wait_ns for s in own if s.input_wait_ns]
        rate = median(read) / (median(waits) / 1e9) if waits else 0.0
        cpu = _cpu_share(own)
        busy = cpu is not None and cpu >= DECODE_CPU_SHARE
        kind = "io" if rate >= IO_MIN_READ_RATE and not busy else "decode"
        verdicts[kind][rank] = {
            "read_per_step_mib": mib(sum(read) / len(read)),
            "median_read_per_step_mib": mib(median(read)),
            "read_ops_per_step": round(sum(s.read_ops or 0 for s in own) / len(own), 1),
            "read_rate_during_wait_mib_s": mib(rate),
            "cpu_share": None if cpu is None else round(cpu, 4),
            "input_share": round(stats["share"], 4),
            "detail_steps_left_out": sum(1 for s in per_rank[rank] if s.detail),
        }
    findings = []
    thresholds = {
        "io_min_read_rate_mib_s": mib(IO_MIN_READ_RATE),
        "decode_cpu_share": DECODE_CPU_SHARE,
    }
    io = verdicts["io"]
    if io:
        findings.append(
            Finding(
                rule="io_bound_input",
                severity="medium",
                summary=(
                    f"the input wait on {ranks_text(list(verdicts['io']))} goes to reading: "
                    f"{max(float(str(v['read_rate_during_wait_mib_s'])) for v in io.values())} "
                    "MiB read per second of wait, CPU not busy"
                ),
                evidence={"by_rank": {str(r): v for r, v in verdicts["io"].items()}, **thresholds},
                suggestion=(
                    "Read in parallel and ahead: interleave(num_parallel_calls=AUTOTUNE) over "
                    "several files, TFRecordDataset(num_parallel_reads=...), larger files / "
                    "buffer_size, prefetch; cache() or local copies of remote data; check the "
                    "storage (system.disk.io) for its limit."
                ),
            )
        )
    if verdicts["decode"]:
        findings.append(
            Finding(
                rule="decode_bound_input",
                severity="medium",
                summary=(
                    f"the input wait on {ranks_text(list(verdicts['decode']))} is not reading:"
                    " little is read for the time waited, so the stages after the read (parse, "
                    "decode, augment, py_function) hold the batches back"
                ),
                evidence={
                    "by_rank": {str(r): v for r, v in verdicts["decode"].items()},
                    **thresholds,
                },
                suggestion=(
                    "Parallelise and shrink the per-element work: map(..., num_parallel_calls="
                    "tf.data.AUTOTUNE), batch before map (vectorised parsing), replace "
                    "py_function / numpy_function with TF ops, decode or resize offline, cache() "
                    "after the expensive map; on op-traced steps (TF_OTEL_OPS_EVERY) the tf.data "
                    "stages show as spans under the input span."
                ),
            )
        )
    return findings


# -- CPU --------------------------------------------------------------------------------------


def cpu_bound_findings(samples: Sequence[StepSample]) -> List[Finding]:
    busy = {}
    cores = {}
    for rank, own in by_rank(samples).items():
        share = _cpu_share([s for s in own if not s.detail])  # not tf_otel's own detail work
        if share is not None and share >= CPU_BOUND_SHARE:
            busy[rank] = round(share, 4)
            cores[rank] = max(s.cpus or 0 for s in own)
    if not busy:
        return []
    worst = max(busy.values())
    return [
        Finding(
            rule="cpu_bound",
            severity="high" if worst >= CPU_HIGH_SHARE else "medium",
            summary=(
                f"every core is busy on {ranks_text(list(busy))}: the process uses "
                f"{worst:.0%} of its {cores[max(busy, key=busy.__getitem__)]} cores' time"
            ),
            evidence={
                "cpu_share_by_rank": {str(r): v for r, v in busy.items()},
                "cores_by_rank": {str(r): c for r, c in cores.items()},
                "threshold": CPU_BOUND_SHARE,
                "source": "tf_otel.process.cpu_time_ns / (tf_otel.process.cpus x wall time)",
            },
            suggestion=(
                "The host's CPU limits the step: move input work off it (tf.data service, "
                "offline preprocessing), cut parallelism that competes with the model "
                "(num_parallel_calls, inter/intra-op threads), give the rank more cores or fewer "
                "ranks per host; a GPU job should not be CPU-bound."
            ),
        )
    ]


# -- between steps ----------------------------------------------------------------------------


def between_steps_findings(samples: Sequence[StepSample]) -> List[Finding]:
    timed = [s for s in samples if s.between_ns is not None]
    if len(timed) < MIN_STEPS:
        return []
    between = sum(s.between_ns or 0 for s in timed)
    wall = sum(s.wall_ns for s in timed) or 1
    share = between / wall
    per_step = between / len(timed)
    if share < BETWEEN_SHARE or per_step < BETWEEN_MIN_NS:
        return []
    callbacks = sum(s.callback_ns or 0 for s in timed)
    checkpoints = sum(s.checkpoint_ns or 0 for s in timed)
    # time nobody is named for must recur: one scheduler stall between two steps is the
    # step_outliers' business, not a habit of the program
    unnamed_steps = sum(
        (s.between_ns or 0) - (s.callback_ns or 0) - (s.checkpoint_ns or 0) >= BETWEEN_MIN_NS
        for s in timed
    )
    if 2 * (callbacks + checkpoints) < between and unnamed_steps < BETWEEN_MIN_RECURRING:
        return []
    named: Dict[str, Tuple[float, int]] = {}  # name -> (ms, steps)
    for sample in timed:
        for name, spent in sample.top:
            total, steps = named.get(name, (0.0, 0))
            named[name] = (total + spent, steps + 1)
    top = sorted(named.items(), key=lambda item: (-item[1][0], item[0]))[:5]
    ranks = sorted({s.rank for s in timed})
    what = ", ".join(f"{name} ({spent:.0f} ms in {steps} steps)" for name, (spent, steps) in top)
    return [
        Finding(
            rule="time_between_steps",
            severity="high" if share >= BETWEEN_HIGH_SHARE else "medium",
            summary=(
                f"{share:.0%} of the wall time passes between steps "
                f"({ms(per_step)} ms a step on average)"
                + (f"; there: {what}" if what else "; no callback or checkpoint named")
            ),
            evidence={
                "share": round(share, 4),
                "between_ms": ms(between),
                "per_step_ms": ms(per_step),
                "callbacks_ms": ms(callbacks),
                "checkpoints_ms": ms(checkpoints),
                "other_ms": ms(max(0, between - callbacks - checkpoints)),
                "named": [
                    {"name": name, "ms": round(spent, 1), "steps": steps}
                    for name, (spent, steps) in top
                ],
                "ranks": ranks,
                "unnamed_steps": unnamed_steps,
                "thresholds": {
                    "share": BETWEEN_SHARE,
                    "highly": BETWEEN_HIGH_SHARE,
                    "min_per_step_ms": ms(BETWEEN_MIN_NS),
                    "min_unnamed_steps": BETWEEN_MIN_RECURRING,
                },
            },
            suggestion=(
                "Make the work between steps cheaper or rarer: callbacks that act every N "
                "batches, async checkpoints (tf.train.CheckpointOptions(enable_async=True)) or "
                "saving less often, logging through summaries instead of prints / .numpy() "
                "calls; Keras steps_per_execution runs several batches per call. Time not named "
                "is the framework's or the program's own code between steps."
            ),
        )
    ]


# -- memory -----------------------------------------------------------------------------------


def theil_sen_slope(points: Sequence[Tuple[float, float]]) -> float:
    """The median of the pairwise slopes (robust to outliers); 0 for fewer than 2 points."""
    if len(points) > _THEIL_SEN_POINTS:
        stride = len(points) / _THEIL_SEN_POINTS
        points = [points[int(i * stride)] for i in range(_THEIL_SEN_POINTS)]
    slopes = [
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(points)
        for x2, y2 in points[i + 1 :]
        if x2 != x1
    ]
    return median(slopes) if slopes else 0.0


def memory_growth_findings(samples: Sequence[StepSample]) -> List[Finding]:
    growing = {}
    for rank, own in by_rank(samples).items():
        points = [
            (float(s.step), float(s.rss_bytes))
            for s in own
            if s.rss_bytes is not None and s.step is not None
        ]
        if len(points) < MEMORY_MIN_STEPS:
            continue
        slope = theil_sen_slope(points)
        third = len(points) // 3
        thirds = [
            median([y for _, y in points[:third]]),
            median([y for _, y in points[third : 2 * third]]),
            median([y for _, y in points[2 * third :]]),
        ]
        span = points[-1][0] - points[0][0]
        growth = slope * span
        if (
            thirds[0] > 0  # a zero RSS is a bad file, not a baseline to grow from
            and slope >= MEMORY_MIN_SLOPE
            and growth >= MEMORY_MIN_GROWTH * thirds[0]
            and thirds[0] < thirds[1] < thirds[2]
        ):
            growing[rank] = {
                "mib_per_100_steps": mib(slope * 100),
                "growth_mib": mib(growth),
                "growth_share": round(growth / thirds[0], 4),
                "rss_first_third_mib": mib(thirds[0]),
                "rss_last_third_mib": mib(thirds[2]),
                "steps": len(points),
            }
    if not growing:
        return []
    worst = max(growing, key=lambda r: (growing[r]["mib_per_100_steps"], -r))
    return [
        Finding(
            rule="memory_growth",
            severity="medium",
            summary=(
                f"resident memory grows through the run on {ranks_text(list(growing))}: "
                f"{growing[worst]['mib_per_100_steps']} MiB per 100 steps "
                f"(+{growing[worst]['growth_share']:.0%} over the steps analysed)"
            ),
            evidence={
                "by_rank": {str(r): v for r, v in growing.items()},
                "thresholds": {
                    "mib_per_100_steps": mib(MEMORY_MIN_SLOPE * 100),
                    "growth_share": MEMORY_MIN_GROWTH,
                },
                "method": "Theil-Sen slope of process.memory.usage over the steady steps",
            },
            suggestion=(
                "Something keeps references across steps: Python lists of tensors or losses "
                "(append loss.numpy() instead), tf.function retracing on new shapes or Python "
                "values (each trace keeps a graph), unbounded dataset cache() or shuffle buffers, "
                "growing metrics / summaries; a host OOM at this rate ends the job."
            ),
        )
    ]


# -- batch size -------------------------------------------------------------------------------


def small_batch_findings(samples: Sequence[StepSample]) -> List[Finding]:
    known = [s for s in samples if s.batch_size and s.between_ns is not None]
    if len(known) < MIN_STEPS:
        return []
    wall = sum(s.wall_ns for s in known) or 1
    overhead = sum(
        max(0, (s.between_ns or 0) - (s.callback_ns or 0) - (s.checkpoint_ns or 0)) for s in known
    )
    share = overhead / wall
    median_step = median([s.duration_ns for s in known])
    if share < SMALL_BATCH_OVERHEAD_SHARE or median_step > SMALL_BATCH_MAX_STEP_NS:
        return []
    sizes = sorted({s.batch_size for s in known if s.batch_size})
    gpu = [s.gpu_percent for s in known if s.gpu_percent is not None]
    evidence = {
        "batch_sizes": sizes,
        "framework_between_share": round(share, 4),
        "median_step_ms": ms(median_step),
        "framework_between_per_step_ms": ms(overhead / len(known)),
        "thresholds": {
            "framework_between_share": SMALL_BATCH_OVERHEAD_SHARE,
            "max_median_step_ms": ms(SMALL_BATCH_MAX_STEP_NS),
        },
    }
    if gpu:
        evidence["gpu_utilization_median_percent"] = round(median(gpu), 1)
    return [
        Finding(
            rule="small_batch",
            severity="low",
            summary=(
                f"batch {', '.join(map(str, sizes))} is small for this device: the framework's "
                f"own work between steps is {share:.0%} of the wall time and a step takes "
                f"{ms(median_step)} ms"
            ),
            evidence=evidence,
            suggestion=(
                "Amortise the per-step cost: a larger batch (scale the learning rate with it), "
                "Keras steps_per_execution > 1, or several batches per tf.function call."
            ),
        )
    ]


def whole_step_findings(samples: Sequence[StepSample]) -> List[Finding]:
    """Every rule of this module over the samples (``whole_step.step_samples``)."""
    findings = input_source_findings(samples)
    findings += cpu_bound_findings(samples)
    findings += between_steps_findings(samples)
    findings += memory_growth_findings(samples)
    findings += small_batch_findings(samples)
    return findings
