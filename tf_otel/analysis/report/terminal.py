"""The default terminal report: summary, critical-path split, ranks, notable steps, findings.

A category a step did not measure prints as "n/m" (the split: "not measured" and the setting
that measures it); compute that holds what was not measured is marked "+" (``measured``).

Usage::

    print(render_table(result, max_steps=15))
"""

from __future__ import annotations

import textwrap
from typing import Dict, FrozenSet, List, Sequence

from tf_otel.analysis.measured import (
    NOT_MEASURED,
    CategoryShare,
    cause_label,
    holds_text,
    settings_text,
)
from tf_otel.analysis.path.critical_path import PATH_CATEGORIES, PATH_COMPUTE
from tf_otel.analysis.report import ms, notable_steps
from tf_otel.analysis.result import AnalysisResult

_SHORT = {
    "compute": "compute",
    "input": "input",
    "communication": "comm",
    "straggler_wait": "wait",
    "framework": "framework",
    "before_step": "before",
}


NOT_MEASURED_CELL = "n/m"  # a step's category that was not measured (step rows are narrow)


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> List[str]:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for number, row in enumerate(cells):
        parts = [
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ]
        lines.append("  " + "  ".join(parts).rstrip())
        if number == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return lines


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _step_cell(category: str, value: int, length: int, measured: FrozenSet[str], held: bool) -> str:
    if category not in measured:
        return NOT_MEASURED_CELL
    return _pct(value, length) + ("+" if held and category == PATH_COMPUTE else "")


def category_lines(shares: Dict[str, CategoryShare]) -> List[str]:
    """The job's split by category: shares over the steps where each was measured, "not
    measured" (and the setting) where it was measured on no step."""
    lines = ["critical path by category (steady steps; each share over the steps that measured it)"]
    rows = []
    for category, found in shares.items():
        steps = f"{found.measured_steps}/{found.steps}"
        if not found.measured:
            rows.append((category, NOT_MEASURED, "-", steps))
            continue
        share = "-" if found.share is None else f"{100.0 * found.share:.1f}%"
        if category == PATH_COMPUTE and found.holds:
            share += "+"
        rows.append((category, f"{ms(found.ns):.3f}", share, steps))
    lines += _table(("category", "ms", "share", "measured steps"), rows)
    compute = shares[PATH_COMPUTE]
    if compute.holds:
        lines.append(
            f"  +: compute holds {holds_text(compute.holds)} on {compute.holds_steps} of "
            f"{compute.steps} steps, where they were {NOT_MEASURED}"
        )
    never = [c for c, found in shares.items() if found.setting and not found.measured]
    partly = [c for c, found in shares.items() if found.setting and found.measured]
    reasons = {c: found.setting for c, found in shares.items()}
    if never:
        lines.append(f"  {NOT_MEASURED}: {settings_text(never, reasons)}")
    if partly:
        lines.append(f"  {NOT_MEASURED} on some steps: {settings_text(partly, reasons)}")
    return lines


def render_table(result: AnalysisResult, max_steps: int = 15) -> str:
    lines: List[str] = []
    ranks = result.ranks()
    total = result.total_ns
    what_if = result.what_if_total_ns
    lines.append(
        f"tf-otel analyze: job {result.job_id or '?'}, {len(result.steps)} steps, "
        f"{len(ranks)} ranks ({result.source})"
    )
    lines.append(
        f"step time: median {ms(result.outliers.median_ns):.3f} ms, total {ms(total):.3f} ms; "
        f"with stragglers at the median rank: {ms(what_if):.3f} ms "
        f"(-{_pct(total - what_if, total)})"
    )
    warmup = result.warmup_steps
    if warmup:
        lines.append(
            f"warm-up (tracing/compiling, kept out of the statistics): steps "
            f"{', '.join(s.label for s in warmup)} "
            f"({ms(sum(s.trace.duration_ns for s in warmup)):.3f} ms)"
        )
    noise = result.stragglers.noise
    lines.append(
        f"straggler threshold: {ms(noise.threshold_ns):.3f} ms (rank lateness noise: centre "
        f"{ms(noise.center_ns):.3f} ms, sigma {ms(noise.sigma_ns):.3f} ms)"
    )
    lines.append("")
    by_category = result.by_category()
    path_total = sum(by_category.values())
    lines += category_lines(result.category_shares())
    lines.append("")
    lines.append("ranks")
    by_rank = result.by_rank()
    rows = []
    for stats in result.stragglers.ranks.values():
        count = len(stats.straggler_steps)
        rows.append(
            (
                stats.rank,
                _pct(by_rank.get(stats.rank, 0), path_total),
                count,
                f"{ms(stats.excess_ns / count):.3f}" if count else "-",
                f"{stats.last_arrivals}/{stats.collectives}",
                stats.last_to_end,
            )
        )
    lines += _table(
        ("rank", "on path", "straggler steps", "mean excess ms", "last arrivals", "last to end"),
        rows,
    )
    lines.append("")
    shown = notable_steps(result, max_steps)
    title = (
        "steps"
        if len(shown) == len(result.steps)
        else (f"steps ({len(shown)} of {len(result.steps)}: outliers, stragglers, slowest)")
    )
    lines.append(title)
    header = ["step", "ms"] + [_SHORT[c] for c in PATH_CATEGORIES] + ["straggler", "what-if ms"]
    step_rows = []
    unmeasured = False
    for step in shown:
        split = step.path.by_category()
        length = sum(split.values())
        straggler = "-"
        if step.straggler:
            straggler = (
                f"r{step.straggler.rank} +{ms(step.straggler.excess_ns):.3f}"
                f" {cause_label(step.straggler.category, step.measured)}"
            )
        label = step.label + (" *" if step.outlier else " w" if step.warmup else "")
        held = bool(step.not_measured)
        unmeasured = unmeasured or held
        step_rows.append(
            [label, f"{ms(step.trace.duration_ns):.3f}"]
            + [_step_cell(c, split[c], length, step.measured, held) for c in PATH_CATEGORIES]
            + [straggler, f"{ms(step.what_if_ns):.3f}"]
        )
    lines += _table(header, step_rows)
    if unmeasured:
        lines.append(
            f"  {NOT_MEASURED_CELL}: not measured in that step; +: compute holds what was not "
            "measured"
        )
    if result.outliers.outliers:
        lines.append(f"  * outlier (> {ms(result.outliers.threshold_ns):.3f} ms)")
    if warmup:
        lines.append("  w warm-up")
    lines.append("")
    if result.findings:
        lines.append("findings")
        for finding in result.findings:
            lines.append(f"  [{finding.severity}] {finding.rule}: {finding.summary}")
            evidence = ", ".join(f"{k}={v}" for k, v in finding.evidence.items())
            lines += textwrap.wrap(
                evidence, 96, initial_indent="    evidence: ", subsequent_indent="      "
            )
            lines += textwrap.wrap(
                finding.suggestion,
                96,
                initial_indent="    suggestion: ",
                subsequent_indent="      ",
            )
    else:
        lines.append("findings: none")
    if result.warnings:
        lines.append("")
        lines.append(f"warnings ({len(result.warnings)})")
        for warning in result.warnings[:10]:
            lines.append(f"  {warning}")
        if len(result.warnings) > 10:
            lines.append(f"  ... {len(result.warnings) - 10} more (--format json lists all)")
    return "\n".join(lines)
