"""``tf-otel analyze``: cross-rank critical path, stragglers, outliers and findings.

Usage::

    tf-otel analyze traces/                         # OTLP-JSON files (TF_OTEL_FILE output)
    tf-otel analyze traces/ --format json > report.json
    tf-otel analyze --jaeger http://localhost:16686 --job 1234 --steps 100:200
    tf-otel analyze --tempo http://localhost:3200 --job 1234 --since 2h --html report.html
    tf-otel analyze traces/ --html report.html --png pictures/

Exit codes: 0 done, 2 bad input (one line on stderr naming the file or URL). A trace file's
line that is not JSON (the record a killed rank was writing, cut short; a corrupt line) is
skipped with one line on stderr naming the file, its byte offset and what was lost, and the
report's warnings say it; --strict makes it an error (exit 2) instead.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

from tf_otel import cli_args
from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.rules.gc_pause import paused_gc

if TYPE_CHECKING:
    from tf_otel.analysis.load.spill import SpillSource
    from tf_otel.analysis.result import AnalysisResult

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time_ns(text: Optional[str]) -> Optional[int]:
    """Epoch seconds, ISO 8601 (naive = local time) or a lookback like '30m', '2h', '1d'."""
    if text is None:
        return None
    value = text.strip()
    bad = AnalysisError(
        f"bad time {text!r} (epoch seconds, ISO 8601, or a lookback like 30m, 2h, 1d)"
    )
    try:
        match = _RELATIVE.match(value)
        if match:
            return time.time_ns() - int(float(match.group(1)) * _UNIT_S[match.group(2)] * 1e9)
        try:
            return int(float(value) * 1e9)
        except ValueError:
            pass
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        return int(parsed.timestamp() * 1e9)
    except (ValueError, OverflowError, OSError):  # not a time; inf / nan; beyond the calendar
        raise bad from None


def add_source_arguments(parser: argparse.ArgumentParser, title: str) -> None:
    """Where the spans come from (files, Jaeger or Tempo): shared by analyze and export."""
    source = parser.add_argument_group(title)
    source.add_argument("paths", nargs="*", metavar="PATH", help="OTLP-JSON files or directories")
    source.add_argument(
        "--jaeger", metavar="URL", help="Jaeger query service, e.g. http://host:16686"
    )
    source.add_argument("--tempo", metavar="URL", help="Tempo HTTP API, e.g. http://host:3200")
    source.add_argument("--service", help="Jaeger service name (default: every service)")
    source.add_argument(
        "--trace-id",
        action="append",
        dest="trace_ids",
        metavar="ID",
        help="fetch these traces from the backend instead of searching",
    )
    source.add_argument(
        "--limit", type=cli_args.positive_int, default=10000, help="backend search limit"
    )
    source.add_argument(
        "--strict",
        action="store_true",
        help="a trace file's line that is not JSON (cut short or corrupt) is an error (exit 2) "
        "instead of skipped with a warning",
    )
    source.add_argument(
        "--progress",
        action="store_true",
        default=None,
        help="show a progress bar even when stderr is not a terminal",
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = cli_args.subcommand(
        subparsers,
        "analyze",
        "cross-rank critical path, stragglers and findings from step traces",
        __doc__,
    )
    add_source_arguments(parser, "source (files, or one backend)")
    select = parser.add_argument_group("selection")
    select.add_argument("--job", help="tf_otel.job.id (required when the input holds several)")
    select.add_argument("--steps", metavar="RANGE", help="N, A:B (inclusive), A: or :B")
    select.add_argument("--since", help="steps starting at or after: epoch s, ISO 8601, or 2h")
    select.add_argument("--until", help="steps starting before: epoch s, ISO 8601, or 30m")
    tuning = parser.add_argument_group("straggler threshold")
    tuning.add_argument(
        "--straggler-min-share",
        type=cli_args.share,
        default=0.0,
        help="besides beating the run's own noise (learned from the run), the excess must be "
        "at least this share of the step (0: off)",
    )
    tuning.add_argument(
        "--straggler-min-ms",
        type=cli_args.non_negative_float,
        default=1.0,
        help="and at least this many ms (1.0; the floor when the run shows no noise)",
    )
    tuning.add_argument(
        "--group-by",
        metavar="ATTRIBUTE",
        help="the resource attribute that labels ranks slow together, e.g. a pipeline stage "
        "the job sets in OTEL_RESOURCE_ATTRIBUTES (default: host.name where they share it)",
    )
    engine = parser.add_argument_group("where it runs (trace files)")
    engine.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="a Dask scheduler (tcp://host:8786) to run on; default: this machine, one worker "
        "process per CPU for big inputs (TF_OTEL_ANALYZE_WORKERS sets how many)",
    )
    engine.add_argument(
        "--spill-dir",
        metavar="DIR",
        help="where the decoded spans wait, by trace (default: TMPDIR; with --scheduler: a "
        "directory every worker sees)",
    )
    output = parser.add_argument_group("output")
    output.add_argument("--format", choices=("table", "json"), default="table")
    output.add_argument(
        "--with-path", action="store_true", help="json: include every step's critical path segments"
    )
    output.add_argument(
        "--max-steps", type=cli_args.non_negative_int, default=15, help="table: step rows shown"
    )
    output.add_argument("--html", metavar="FILE", help="write an HTML report with swimlanes")
    output.add_argument("--png", metavar="DIR", help="write swimlane PNGs (needs matplotlib)")
    output.add_argument(
        "--max-pictures",
        type=cli_args.non_negative_int,
        default=20,
        help="html/png: steps drawn (outliers, stragglers, slowest first)",
    )
    parser.set_defaults(func=run)
    return parser


def _load(
    args: argparse.Namespace, start_ns: Optional[int], end_ns: Optional[int]
) -> Tuple[SpillSource, str]:
    """A ``SpillSource`` of the trace files or the backend's answers (kept on disk by trace: the
    analysis holds a step at a time) and what they came from."""
    sources = [bool(args.paths), bool(args.jaeger), bool(args.tempo)]
    if sum(sources) != 1:
        raise AnalysisError("give exactly one source: trace files/directories, --jaeger or --tempo")
    if args.jaeger or args.tempo:
        from tf_otel.analysis.load.spill import spill_backend

        kind, url = ("jaeger", args.jaeger) if args.jaeger else ("tempo", args.tempo)
        # each answer kept on disk by trace as it comes: memory holds one
        spilled = spill_backend(
            kind,
            url,
            args.job,
            args.service,
            start_ns,
            end_ns,
            args.limit,
            args.trace_ids,
            args.progress,
            getattr(args, "spill_dir", None),
        )
        return spilled, url
    from tf_otel.analysis.load.spill import load_spilled

    spilled = load_spilled(
        args.paths,
        args.progress,
        engine=getattr(args, "engine", None),
        spill_dir=getattr(args, "spill_dir", None),
        strict=bool(getattr(args, "strict", False)),
    )
    return spilled, ", ".join(args.paths)


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as error:
        raise AnalysisError(f"{path}: cannot write ({error})") from None


def run(args: argparse.Namespace) -> int:
    try:
        with paused_gc():  # millions of acyclic objects: collections would only rescan them
            return _run(args)
    except AnalysisError as error:
        print(f"tf-otel analyze: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tf-otel analyze ... | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _run(args: argparse.Namespace) -> int:
    from tf_otel.analysis.steps import parse_step_range

    if args.png:
        from tf_otel.analysis.report.png import require_matplotlib

        require_matplotlib()
    step_range = parse_step_range(args.steps) if args.steps else None
    start_ns, end_ns = parse_time_ns(args.since), parse_time_ns(args.until)
    if args.paths:  # trace files: read and analysed by the engine (Jaeger, Tempo: here)
        from tf_otel.analysis.engine import open_engine
        from tf_otel.analysis.load.files import requested_workers

        size = _bytes_under(args.paths)
        with open_engine(requested_workers(None), args.scheduler, size) as args.engine:
            return _analyze(args, step_range, start_ns, end_ns)
    args.engine = None
    return _analyze(args, step_range, start_ns, end_ns)


def _bytes_under(paths: List[str]) -> int:
    """The size of the files under ``paths`` (what decides the engine; errors come later)."""
    total = 0
    for raw in paths:
        path = Path(raw)
        for file in path.rglob("*") if path.is_dir() else [path]:
            try:
                total += file.stat().st_size if file.is_file() else 0
            except OSError:
                continue
    return total


def _analyze(
    args: argparse.Namespace,
    step_range: Optional[Tuple[Optional[int], Optional[int]]],
    start_ns: Optional[int],
    end_ns: Optional[int],
) -> int:
    from tf_otel.analysis.analyze import analyze_source

    loaded, source = _load(args, start_ns, end_ns)
    options: Tuple[Any, ...] = (
        source,
        args.job,
        step_range,
        start_ns,
        end_ns,
        args.straggler_min_share,
        int(args.straggler_min_ms * 1e6),
    )
    with loaded:  # the pictures read their steps' spans again
        result = analyze_source(
            loaded,
            *options,
            group_by=args.group_by,
            progress=args.progress,
            engine=args.engine,
            keep_segments=args.with_path,  # the pictures read their steps again
        )
        _report(args, result)
    return 0


def _report(args: argparse.Namespace, result: AnalysisResult) -> None:
    from tf_otel.analysis.report.json_report import to_json
    from tf_otel.analysis.report.terminal import render_table

    if args.format == "json":
        print(json.dumps(to_json(result, args.with_path), indent=2))
    else:
        print(render_table(result, args.max_steps))
    if args.html:
        from tf_otel.analysis.report.html import render_html

        _write(args.html, render_html(result, args.max_pictures))
    if args.png:
        from tf_otel.analysis.report.png import write_pngs

        written = write_pngs(result, Path(args.png), args.max_pictures)
        print(f"wrote {len(written)} PNG files to {args.png}", file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="tf-otel")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["analyze"] + list(argv if argv is not None else sys.argv[1:]))
    return args.func(args)
