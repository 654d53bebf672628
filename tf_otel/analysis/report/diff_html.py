"""``tf-otel diff --html``: the comparison as a page: the verdict and tables, the critical path by
category as paired bars, and each run's typical step drawn one above the other on one time scale.

Usage::

    Path("diff.html").write_text(render_diff_html(report, {"baseline": typical, ...}))

A run's typical step is its steady step (main series) nearest the run's median step time
(``typical_step``); a side given as a saved report holds no spans, so its step is not drawn and
the page says why. Self-contained like the analyze report: no script, no external files.
"""

from __future__ import annotations

import html
from typing import Any, Dict, List, Optional

from tf_otel.analysis.report import ms
from tf_otel.analysis.report.diff_table import render_diff
from tf_otel.analysis.report.html import COLOURS, _legend, page_head, swimlane_svg
from tf_otel.analysis.result import AnalysisResult, StepResult

TOOL = "tf-otel diff"
SIDES = ("baseline", "candidate")
BAR_WIDTH = 700  # the longest bar, px
BAR_LABEL = 130


def typical_step(result: AnalysisResult, series: Optional[str]) -> Optional[StepResult]:
    """The steady step of ``series`` nearest the median steady step time, with its spans (read
    now, while its source is open); None without steady steps."""
    digests = result.digests()
    keys = [k for k, d in enumerate(digests) if not d.warmup and d.series == series]
    if not keys:
        return None
    durations = sorted(digests[k].duration_ns for k in keys)
    median = durations[len(durations) // 2]
    key = min(keys, key=lambda k: (abs(digests[k].duration_ns - median), k))
    step = result.with_spans(result.steps[key])
    for timeline in step.trace.ranks.values():  # read what the drawing needs, here
        timeline.nodes, timeline.fillers  # noqa: B018 - properties that read the spans
    return step


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"


def _bars(rows: List[Dict[str, Any]]) -> str:
    """Each category's mean ms a step, baseline over candidate, on one scale."""
    values = [row.get(f"{side}_ms") or 0.0 for row in rows for side in SIDES]
    top = max(values, default=0.0) or 1.0
    height = 16 + 30 * len(rows)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{BAR_LABEL + BAR_WIDTH + 160}" '
        f'height="{height}" font-family="sans-serif" font-size="11">'
    ]
    for i, row in enumerate(rows):
        y = 8 + 30 * i
        colour = COLOURS.get(row["category"], "#999")
        out.append(f'<text x="2" y="{y + 15}">{html.escape(row["category"])}</text>')
        for j, side in enumerate(SIDES):
            value = row.get(f"{side}_ms")
            width = BAR_WIDTH * (value or 0.0) / top
            opacity = "0.45" if side == "baseline" else "0.9"
            text = "not measured" if value is None else f"{value:.3f} ms"
            out.append(
                f'<rect x="{BAR_LABEL}" y="{y + 12 * j}" width="{max(0.5, width):.1f}" '
                f'height="11" fill="{colour}" fill-opacity="{opacity}"/>'
                f'<text x="{BAR_LABEL + width + 4:.1f}" y="{y + 12 * j + 9}">'
                f"{side[:4]} {text}</text>"
            )
    out.append("</svg>")
    return "".join(out)


def render_diff_html(report: Dict[str, Any], typical: Dict[str, Optional[StepResult]]) -> str:
    verdict = report["verdict"]
    moved = "".join(f"<li>{html.escape(text)}</li>" for text in report["moved"])
    parts = [
        page_head(f"{report['baseline']['source']} -> {report['candidate']['source']}", TOOL),
        f"<h2>Verdict: {html.escape(verdict['change'])}</h2><p>median step "
        f"{_ms(verdict['baseline_median_ms'])} -> {_ms(verdict['candidate_median_ms'])} ms "
        f"(x{verdict['ratio']}); noise threshold {_ms(verdict['threshold_ms'])} ms, from the "
        "runs' own step-to-step spread</p>",
        f"<h2>What moved</h2><ul>{moved or '<li>nothing beyond the noise</li>'}</ul>",
        "<h2>Critical path by category (mean ms a step; pale: baseline)</h2>",
        _bars(report["by_category"]),
    ]
    drawn = [typical.get(side) for side in SIDES]
    span_ns = max((step.trace.duration_ns for step in drawn if step is not None), default=0)
    parts.append("<h2>Typical step of each run (one time scale)</h2>" + _legend())
    for side, step in zip(SIDES, drawn):
        source = html.escape(str(report[side]["source"]))
        if step is None:
            parts.append(
                f"<h3>{side}: {source}</h3><p>not drawn: a saved report holds no spans "
                "(give its trace folder to draw its typical step)</p>"
            )
            continue
        parts.append(
            f"<h3>{side}: {source}, step {html.escape(step.label)}, "
            f"{ms(step.trace.duration_ns):.3f} ms (nearest the median)</h3>"
        )
        parts.append(swimlane_svg(step, span_ns))
    parts.append("<h2>Tables</h2><pre>" + html.escape(render_diff(report)) + "</pre></body></html>")
    return "\n".join(parts)
