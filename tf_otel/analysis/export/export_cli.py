"""``tf-otel export``: selected steps as a Chrome trace (ui.perfetto.dev, chrome://tracing).

Usage::

    tf-otel export traces/ -o run.json                  # OTLP-JSON files (TF_OTEL_FILE output)
    tf-otel export traces/ --steps 3,5-7 -o steps.json.gz
    tf-otel export traces/ --slowest 5 -o slowest.json
    tf-otel export --jaeger http://localhost:16686 --job 1234 --steps 100:120 -o run.json

Every rank is a process, every span category a track, collectives are flows between ranks;
times are the clock-corrected ones the spans carry. Without --steps / --slowest the first
--max-steps steps are written (and a line says so). An output ending in .gz is gzipped.
The input is kept on disk by trace (``load.spill``), as ``tf-otel analyze`` keeps it: memory
holds one step while the steps are chosen, then the chosen ones.

Exit codes: 0 done, 2 bad input (one line on stderr naming the bad value, file or URL).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from tf_otel import cli_args
from tf_otel.analysis.analyze_cli import add_source_arguments
from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.load.spill import SpillSource
from tf_otel.analysis.rules.gc_pause import paused_gc

DEFAULT_MAX_STEPS = 50
Range = Tuple[Optional[int], Optional[int]]


def parse_steps(text: str) -> List[Range]:
    """'3,5-7,10:' -> [(3, 3), (5, 7), (10, None)]: N, A-B or A:B (inclusive), A:, :B."""
    from tf_otel.analysis.steps import parse_step_range

    ranges: List[Range] = []
    for part in text.split(","):
        if not part.strip():
            raise AnalysisError(f"bad --steps {text!r}: empty item (use e.g. 3,5-7 or 10:20)")
        try:
            low, high = parse_step_range(part.strip())
        except AnalysisError:
            raise AnalysisError(
                f"bad --steps item {part.strip()!r} in {text!r} (use N, A-B, A:B, A: or :B)"
            ) from None
        if low is not None and high is not None and low > high:
            raise AnalysisError(f"bad --steps item {part.strip()!r}: {low} > {high}")
        ranges.append((low, high))
    return ranges


def _positive(name: str, value: Optional[int]) -> None:
    if value is not None and value < 1:
        raise AnalysisError(f"bad {name} {value} (must be at least 1)")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = cli_args.subcommand(
        subparsers,
        "export",
        "write selected steps as a Chrome / Perfetto trace (ui.perfetto.dev)",
        __doc__,
    )
    add_source_arguments(parser, "source (files, or one backend): as tf-otel analyze")
    select = parser.add_argument_group("selection")
    select.add_argument("--job", help="tf_otel.job.id (required when the input holds several)")
    select.add_argument("--steps", metavar="LIST", help="e.g. 3,5-7,10:20 (inclusive), 100:")
    select.add_argument("--slowest", type=int, metavar="K", help="the K longest steps")
    select.add_argument("--since", help="steps starting at or after: epoch s, ISO 8601, or 2h")
    select.add_argument("--until", help="steps starting before: epoch s, ISO 8601, or 30m")
    select.add_argument(
        "--max-steps",
        type=int,
        default=DEFAULT_MAX_STEPS,
        help=f"at most this many steps are written ({DEFAULT_MAX_STEPS})",
    )
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="trace file (.json or .json.gz)"
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        with paused_gc():
            return _run(args)
    except AnalysisError as error:
        print(f"tf-otel export: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _in_ranges(step: int, ranges: List[Range]) -> bool:
    return any((lo is None or step >= lo) and (hi is None or step <= hi) for lo, hi in ranges)


def select(
    steps: Sequence[Any], ranges: Optional[List[Range]], slowest: Optional[int], max_steps: int
) -> Tuple[List[Any], Optional[str]]:
    """The steps to write and, when some were left out by the bound, a line saying so."""
    chosen = list(steps)
    if ranges is not None:
        chosen = [s for s in chosen if s.step is not None and _in_ranges(s.step, ranges)]
    if slowest is not None:
        chosen = sorted(chosen, key=lambda s: -s.duration_ns)[:slowest]
        chosen.sort(key=lambda s: (s.start_ns, s.trace_id))
    note = None
    if len(chosen) > max_steps:
        first, last = chosen[0].step, chosen[max_steps - 1].step
        note = (
            f"{len(chosen)} steps selected; writing the first {max_steps} (steps {first}..{last})"
            " - choose with --steps / --slowest or raise --max-steps"
        )
        chosen = chosen[:max_steps]
    return chosen, note


@dataclass(frozen=True)
class _Outline:
    """What the selection reads of a step (its spans wait on disk until it is chosen)."""

    trace_id: str
    step: Optional[int]
    start_ns: int
    duration_ns: int


def _outlines(traces: SpillSource, job_id: Optional[str]) -> Tuple[List[_Outline], List[str]]:
    """Every step of the job in the input, built one at a time (``steps.group_steps``' order
    and warnings), kept as its ``_Outline``."""
    from tf_otel.analysis.steps import build_step, step_order

    jobs = traces.job_ids()
    if job_id is None and len(jobs) > 1:
        listed = ", ".join(sorted(jobs)[:10])
        raise AnalysisError(f"the traces hold {len(jobs)} jobs ({listed}): choose one with --job")
    if job_id is not None and job_id not in jobs:
        raise AnalysisError(f"no spans of job {job_id!r} in the input")
    outlines: List[_Outline] = []
    warnings: List[str] = []
    for trace_id in sorted(traces.trace_ids()):
        step = build_step(trace_id, _job_spans(traces, trace_id, job_id), warnings)
        if step is not None:
            outlines.append(_Outline(trace_id, step.step, step.start_ns, step.duration_ns))
    outlines.sort(key=step_order)
    return outlines, warnings


def _job_spans(traces: SpillSource, trace_id: str, job_id: Optional[str]) -> List[Any]:
    spans = traces.spans(trace_id)
    return spans if job_id is None else [s for s in spans if s.job_id == job_id]


def _run(args: argparse.Namespace) -> int:
    from tf_otel.analysis.analyze_cli import _load, parse_time_ns
    from tf_otel.analysis.export.chrome_trace import build_trace
    from tf_otel.analysis.steps import build_step, select_steps

    ranges = parse_steps(args.steps) if args.steps else None
    _positive("--slowest", args.slowest)
    _positive("--max-steps", args.max_steps)
    output = args.output
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise AnalysisError(f"bad --output {output!r}: no directory {parent}")
    start_ns, end_ns = parse_time_ns(args.since), parse_time_ns(args.until)
    # kept on disk by trace: memory holds a step at a time, then the chosen steps
    traces, source = _load(args, start_ns, end_ns)
    with traces:
        from tf_otel.analysis.job_choice import chosen_job

        job = chosen_job(traces, args.job)  # a job's attempts are jobs of their own
        outlines, warnings = _outlines(traces, job)
        for warning in warnings[:5]:
            print(f"tf-otel export: warning: {warning}", file=sys.stderr)
        outlines = select_steps(outlines, None, start_ns, end_ns)
        if not outlines:
            raise AnalysisError(f"{source}: no steps (no step.root or step spans) in the input")
        picked, note = select(outlines, ranges, args.slowest, args.max_steps)
        if not picked:
            numbers = [s.step for s in outlines if s.step is not None]
            span = f"{min(numbers)}..{max(numbers)}" if numbers else "none numbered"
            raise AnalysisError(f"bad --steps {args.steps!r}: no such steps (the input has {span})")
        if note:
            print(f"tf-otel export: {note}", file=sys.stderr)
        chosen = [
            step
            for o in picked
            if (step := build_step(o.trace_id, _job_spans(traces, o.trace_id, job), []))
        ]
    attributes = None
    if args.paths:  # the file loader kept only the analysis' attributes: read the rest
        from tf_otel.analysis.export.attributes import full_attributes

        attributes = full_attributes(args.paths, {s.trace_id for s in chosen}, args.progress)
    jobs = sorted({s.job_id for s in chosen if s.job_id})
    other = {"tf_otel.source": source, "tf_otel.job.id": ", ".join(jobs)}
    document, stats = build_trace(chosen, attributes, other)
    _write(output, document)
    skipped = stats.flows_skipped
    print(
        f"tf-otel export: wrote {output}: {stats.steps} steps, {stats.ranks} ranks, "
        f"{stats.slices} slices, {stats.flows} collective flows"
        + (f" ({skipped} not drawn: target before source)" if skipped else "")
        + "; open it in ui.perfetto.dev or chrome://tracing",
        file=sys.stderr,
    )
    return 0


def _write(path: str, document: Any) -> None:
    data = json.dumps(document, separators=(",", ":")).encode()
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "wb", compresslevel=6) as handle:
                handle.write(data)
        else:
            with open(path, "wb") as handle:
                handle.write(data)
    except OSError as error:
        raise AnalysisError(f"{path}: cannot write ({error})") from None


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="tf-otel")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["export"] + list(argv if argv is not None else sys.argv[1:]))
    return args.func(args)
