"""``tf-otel diff``: what changed between two trainings, where, and by how much.

Usage::

    tf-otel diff baseline-traces/ candidate-traces/
    tf-otel analyze traces/ --format json > base.json && tf-otel diff base.json new-traces/
    tf-otel diff base.json new.json --format json
    tf-otel diff baseline-traces/ candidate-traces/ --html diff.html
    tf-otel diff --jaeger http://localhost:16686 job-1234@0 job-1234@1   # two attempts

Each side is a folder or file of trace files (analysed here, one after the other, in bounded
memory), a saved ``tf-otel analyze --format json`` report (its ``profile``) or, with
``--jaeger URL`` / ``--tempo URL``, a job id ("<job id>@<attempt>": one attempt) whose traces the
backend holds. ``--html`` also draws each side's typical step (the steady step nearest its
median) one above the other on one time scale. Exit codes: 0 done (whatever the verdict), 2 bad
input (one line on stderr naming it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from tf_otel.analysis.errors import AnalysisError

if TYPE_CHECKING:
    from tf_otel.analysis.result import StepResult


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "diff",
        help="compare two runs: step time, critical path by category and rank, what moved",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("baseline", help="trace folder/file, or a saved analyze JSON report")
    parser.add_argument("candidate", help="the same, for the run compared with the baseline")
    parser.add_argument("--job", help="tf_otel.job.id in both (when an input holds several)")
    backend = parser.add_mutually_exclusive_group()
    backend.add_argument(
        "--jaeger", metavar="URL", help="sides that are no file are job ids in this Jaeger"
    )
    backend.add_argument("--tempo", metavar="URL", help="the same, in this Tempo")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument(
        "--html", metavar="FILE", help="also write the comparison with both typical steps drawn"
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from tf_otel.analysis.compare.diff import diff_profiles
    from tf_otel.analysis.report.diff_table import render_diff

    draw = bool(args.html)
    backend = (
        ("jaeger", args.jaeger) if args.jaeger else ("tempo", args.tempo) if args.tempo else None
    )
    try:
        baseline, base_step = side_profile(args.baseline, args.job, draw, backend)
        candidate, cand_step = side_profile(args.candidate, args.job, draw, backend)
        report = diff_profiles(baseline, candidate)
    except (AnalysisError, ValueError) as error:
        print(f"tf-otel diff: error: {error}", file=sys.stderr)
        return 2
    report["baseline"] = {"source": args.baseline, **_side(baseline)}
    report["candidate"] = {"source": args.candidate, **_side(candidate)}
    if args.format == "json":
        print(json.dumps(report, indent=1))
    else:
        print(render_diff(report))
    if args.html:
        from tf_otel.analysis.report.diff_html import render_diff_html

        page = render_diff_html(report, {"baseline": base_step, "candidate": cand_step})
        try:
            Path(args.html).write_text(page)
        except OSError as error:
            print(f"tf-otel diff: error: cannot write {args.html}: {error}", file=sys.stderr)
            return 2
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def _side(profile: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "series": profile.get("series"),
        "ranks": len(profile.get("ranks", [])),
        "steady_steps": profile["step_ms"]["n"],
    }


def side_profile(
    source: str,
    job: Optional[str] = None,
    typical: bool = False,
    backend: Optional[Tuple[str, str]] = None,
) -> Tuple[Dict[str, Any], Optional[StepResult]]:
    """One side's profile: a saved report's, else the analysis of the trace files there, or of
    the job ``source`` names in ``backend`` ("jaeger" or "tempo", its URL) where no file is;
    and, where ``typical`` and there are spans, its typical step with its spans."""
    path = Path(source)
    if not path.exists() and backend is not None:
        return _backend_profile(backend, source, typical)
    if not path.exists():
        raise AnalysisError(f"{source}: no such file or folder")
    saved = _saved_report(path)
    if saved is not None:
        profile = saved.get("profile")
        if not isinstance(profile, dict):
            raise AnalysisError(
                f"{source}: a report without a profile (written before tf-otel diff existed): "
                "run tf-otel analyze --format json on its traces again"
            )
        return profile, None
    from tf_otel.analysis.load.spill import load_spilled

    with load_spilled([source], strict=False) as loaded:
        return _analysed(loaded, source, job, typical)


def _analysed(
    loaded: Any, source: str, job: Optional[str], typical: bool
) -> Tuple[Dict[str, Any], Optional[StepResult]]:
    """The profile of an open source's analysis, and its typical step where ``typical``."""
    from tf_otel.analysis.analyze import analyze_source
    from tf_otel.analysis.compare.profile import run_profile
    from tf_otel.analysis.report.diff_html import typical_step

    # the drawn step needs its path's segments; a plain diff keeps none
    result = analyze_source(loaded, source=source, job_id=job, keep_segments=typical)
    profile = run_profile(result)
    return profile, typical_step(result, profile.get("series")) if typical else None


def _backend_profile(
    backend: Tuple[str, str], job_id: str, typical: bool
) -> Tuple[Dict[str, Any], Optional[StepResult]]:
    """The profile of job ``job_id`` ("<job id>@<attempt>": that attempt) as the backend holds
    it: searched by job id, kept on disk by trace."""
    from tf_otel.analysis.load.spill import spill_backend

    kind, url = backend
    with spill_backend(kind, url, job_id, progress=False) as loaded:
        return _analysed(loaded, f"{url} (job {job_id})", job_id, typical)


def _saved_report(path: Path) -> Optional[Dict[str, Any]]:
    """The JSON report at ``path``, if it is one (a trace file is OTLP lines, not a report)."""
    if not path.is_file() or path.suffix != ".json":
        return None
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if isinstance(document, dict) and "schema_version" in document and "summary" in document:
        return document
    return None
