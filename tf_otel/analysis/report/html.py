"""The ``--html`` report: overview first, findings, the split by category (what was not measured
and the setting that measures it), then one SVG swimlane per step that matters.

Usage::

    Path("report.html").write_text(render_html(result, max_pictures=20))

The overview (``report.overview``: step time over the run, a ranks x steps lateness heatmap,
the top stragglers) stays the same size at any scale; swimlanes are drawn only for the
``max_pictures`` steps that matter most (stragglers and outliers first, then the slowest).

Swimlanes: one lane per rank (a rank without spans is drawn empty and labelled), timeline spans
as boxes coloured by category, framework/kernel spans as thin boxes under them, the critical
path as a black outline with connectors where it moves between ranks. Self-contained: no script,
no external files.
"""

from __future__ import annotations

import html
from typing import Iterable, List

from tf_otel.analysis.measured import NOT_MEASURED, cause_label, holds_text
from tf_otel.analysis.path.critical_path import PATH_CATEGORIES, PATH_COMPUTE
from tf_otel.analysis.report import ms, notable_steps
from tf_otel.analysis.report.overview import Overview, overview_from_result, render_overview
from tf_otel.analysis.report.terminal import render_table
from tf_otel.analysis.result import AnalysisResult, StepResult
from tf_otel.record import COLLECTIVE, COMPUTE, INPUT, TRANSFER

COLOURS = {
    COMPUTE: "#4e79a7",
    INPUT: "#f28e2b",
    COLLECTIVE: "#59a14f",
    TRANSFER: "#76b7b2",
    "framework": "#bab0ac",
    "kernel": "#9c755f",
    "straggler_wait": "#e15759",
    "communication": "#59a14f",
    "before_step": "#edc948",
}
STYLE = (
    "body{font-family:sans-serif;margin:20px} pre{background:#f6f6f6;padding:8px}"
    " .finding{margin:8px 0;padding:6px;border-left:4px solid #e15759;background:#fdf3f3}"
    " table{border-collapse:collapse} td,th{border:1px solid #ddd;padding:2px 8px;"
    "font-size:13px;text-align:right}"
)
WIDTH = 1100
LABEL_WIDTH = 70
LANE_HEIGHT = 28
BOX_HEIGHT = 18


def _x(t: int, start: int, duration: int) -> float:
    return LABEL_WIDTH + (WIDTH - LABEL_WIDTH - 10) * (t - start) / max(1, duration)


def _title(name: str, category: str, start: int, end: int, origin: int) -> str:
    return html.escape(
        f"{name} [{category}] {ms(start - origin):.3f}..{ms(end - origin):.3f} ms "
        f"({ms(end - start):.3f} ms)"
    )


def swimlane_svg(step: StepResult, span_ns: int = 0) -> str:  # noqa: C901 - one drawing
    """The step's swimlanes; ``span_ns``: the time the width stands for where longer than the
    step (two steps drawn on one scale: ``tf-otel diff --html``)."""
    trace = step.trace
    origin, duration = trace.start_ns, max(1, trace.duration_ns, span_ns)
    lanes = sorted(set(trace.expected_ranks) | set(trace.ranks))
    lane_of = {rank: i for i, rank in enumerate(lanes)}
    # many ranks: thinner lanes, so a 64-rank step stays about a screen high
    lane_height, box_height = (LANE_HEIGHT, BOX_HEIGHT) if len(lanes) <= 16 else (14, 9)
    height = 24 + lane_height * len(lanes)
    out: List[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="sans-serif" font-size="11">'
    ]
    for rank in lanes:
        y = 20 + lane_height * lane_of[rank]
        label = f"rank {rank}" if rank in trace.ranks else f"rank {rank} (no spans)"
        out.append(f'<text x="2" y="{y + 13}">{html.escape(label)}</text>')
        out.append(
            f'<line x1="{LABEL_WIDTH}" y1="{y + lane_height - 4}" x2="{WIDTH - 10}" '
            f'y2="{y + lane_height - 4}" stroke="#ddd"/>'
        )
        timeline = trace.ranks.get(rank)
        if timeline is None:
            continue
        for span in timeline.fillers:
            x0, x1 = _x(span.start_ns, origin, duration), _x(span.end_ns, origin, duration)
            colour = COLOURS.get(span.category, COLOURS["framework"])
            out.append(
                f'<rect x="{x0:.1f}" y="{y + box_height}" width="{max(0.5, x1 - x0):.1f}" '
                f'height="4" fill="{colour}"><title>'
                f"{_title(span.name, span.category, span.start_ns, span.end_ns, origin)}"
                "</title></rect>"
            )
        for span in timeline.nodes:
            x0, x1 = _x(span.start_ns, origin, duration), _x(span.end_ns, origin, duration)
            colour = COLOURS.get(span.category, "#999")
            out.append(
                f'<rect x="{x0:.1f}" y="{y}" width="{max(0.5, x1 - x0):.1f}" '
                f'height="{box_height}" fill="{colour}" fill-opacity="0.55"><title>'
                f"{_title(span.name, span.category, span.start_ns, span.end_ns, origin)}"
                "</title></rect>"
            )
    previous = None
    for segment in step.path.segments:
        y = 20 + lane_height * lane_of.get(segment.rank, 0)
        x0 = _x(segment.start_ns, origin, duration)
        x1 = _x(segment.end_ns, origin, duration)
        if previous is not None and previous.rank != segment.rank:
            y_prev = 20 + lane_height * lane_of.get(previous.rank, 0)
            out.append(
                f'<line x1="{x0:.1f}" y1="{y_prev + box_height / 2}" x2="{x0:.1f}" '
                f'y2="{y + box_height / 2}" stroke="#000" stroke-width="2"/>'
            )
        out.append(
            f'<rect class="critical" x="{x0:.1f}" y="{y}" width="{max(0.5, x1 - x0):.1f}" '
            f'height="{box_height}" fill="{COLOURS.get(segment.category, "#999")}" '
            f'stroke="#000" stroke-width="2"><title>critical path: '
            f"{_title(segment.name, segment.category, segment.start_ns, segment.end_ns, origin)}"
            "</title></rect>"
        )
        previous = segment
    out.append(
        f'<text x="{LABEL_WIDTH}" y="12">0 ms</text>'
        f'<text x="{WIDTH - 10}" y="12" text-anchor="end">{ms(duration):.3f} ms</text>'
    )
    out.append("</svg>")
    return "".join(out)


def step_shares_text(step: StepResult) -> str:
    """'compute 85%+ (holds input wait: not measured), input not measured (TF_OTEL_...), ...'."""
    split = step.path.by_category()
    length = sum(split.values()) or 1
    missing = step.not_measured
    parts = []
    for category in PATH_CATEGORIES:
        if category in missing:
            parts.append(f"{category} {NOT_MEASURED} ({missing[category]})")
        elif category == PATH_COMPUTE and missing:
            parts.append(
                f"{category} {100 * split[category] / length:.0f}%+ (holds "
                f"{holds_text(missing)}: {NOT_MEASURED})"
            )
        else:
            parts.append(f"{category} {100 * split[category] / length:.0f}%")
    return ", ".join(parts)


def measured_html(result: AnalysisResult) -> str:
    """The job's split by category, saying what was not measured and what measures it."""
    rows = []
    for category, found in result.category_shares().items():
        if not found.measured:
            share = f"{NOT_MEASURED} ({found.setting})"
        else:
            share = f"{100 * (found.share or 0.0):.1f}%"
            if category == PATH_COMPUTE and found.holds:
                share += (
                    f"+ (holds {holds_text(found.holds)} on {found.holds_steps} of "
                    f"{found.steps} steps: {NOT_MEASURED})"
                )
            elif found.setting:
                share += f" ({NOT_MEASURED} on the other steps: {found.setting})"
        rows.append(
            f"<tr><td>{html.escape(category)}</td><td>{found.measured_steps}/{found.steps}</td>"
            f"<td style='text-align:left'>{html.escape(share)}</td></tr>"
        )
    return (
        "<section id='measured'><h2>Critical path by category</h2><p>Steady steps; each share "
        "over the steps that measured it.</p><table><tr><th>category</th><th>measured steps"
        "</th><th>share</th></tr>" + "".join(rows) + "</table></section>"
    )


def _legend() -> str:
    items = [
        (c, COLOURS[c]) for c in (COMPUTE, INPUT, COLLECTIVE, TRANSFER, "framework", "before_step")
    ]
    items.append(("straggler_wait", COLOURS["straggler_wait"]))
    spans = "".join(
        f'<span style="display:inline-block;width:12px;height:12px;background:{colour};'
        f'margin:0 4px 0 12px"></span>{html.escape(name)}'
        for name, colour in items
    )
    return f"<p>{spans} &nbsp; black outline: critical path</p>"


def page_head(title: str, tool: str = "tf-otel analyze") -> str:
    head = html.escape(f"{tool}: {title}")
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{head}</title><style>{STYLE}</style></head><body><h1>{head}</h1>"
    )


def render_overview_page(data: Overview, pictured: Iterable[str] = ()) -> str:
    """A page with the overview only (no step traces needed): big synthetic runs, tests."""
    return page_head(data.title) + render_overview(data, pictured) + "</body></html>"


def render_html(result: AnalysisResult, max_pictures: int = 20) -> str:
    pictured = notable_steps(result, max_pictures)
    parts = [
        page_head(f"job {result.job_id}"),
        render_overview(overview_from_result(result), {step.label for step in pictured}),
        "<section id='findings'><h2>Findings</h2>",
    ]
    if not result.findings:
        parts.append("<p>none</p>")
    for finding in result.findings:
        evidence = ", ".join(f"{k}={v}" for k, v in finding.evidence.items())
        parts.append(
            f"<div class='finding'><b>[{finding.severity}] {html.escape(finding.rule)}</b>: "
            f"{html.escape(finding.summary)}<br><small>evidence: {html.escape(evidence)}</small>"
            f"<br>suggestion: {html.escape(finding.suggestion)}</div>"
        )
    parts.append("</section>")
    parts.append(measured_html(result))
    note = (
        ""
        if len(pictured) == len(result.steps)
        else (
            f" ({len(pictured)} of {len(result.steps)}: outliers, stragglers, slowest;"
            " --max-pictures to change)"
        )
    )
    parts.append(f"<section id='steps'><h2>Steps that matter{note}</h2>" + _legend())
    for step in pictured:
        shares = html.escape(step_shares_text(step))
        straggler = (
            f"; straggler rank {step.straggler.rank} (+{ms(step.straggler.excess_ns):.3f} ms, "
            f"{cause_label(step.straggler.category, step.measured)})"
            if step.straggler
            else ""
        )
        if step.warmup:
            straggler += " (warm-up)"
        parts.append(
            f"<h3 id='step-{html.escape(step.label)}'>step {html.escape(step.label)}: "
            f"{ms(step.trace.duration_ns):.3f} ms{' (outlier)' if step.outlier else ''}"
            f"{html.escape(straggler)}</h3><p>critical path: {shares}</p>"
        )
        parts.append(swimlane_svg(result.with_spans(step)))
    parts.append("</section>")
    parts.append(
        "<section id='summary'><h2>Summary</h2><pre>"
        + html.escape(render_table(result))
        + "</pre></section></body></html>"
    )
    return "\n".join(parts)
