"""``tf-otel diff``'s terminal report.

Usage::

    print(render_diff(report))   # report: diff.diff_profiles(...) with its two sides named
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional


def _ms(value: Optional[float]) -> str:
    return "n/m" if value is None else f"{value:.3f}"


def _signed(value: Optional[float]) -> str:
    return "" if value is None else f"{value:+.3f}"


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return [line(header)] + [line(r) for r in rows]


def render_diff(report: Dict[str, Any]) -> str:
    verdict = report["verdict"]
    base, cand = report["baseline"], report["candidate"]
    lines = [
        f"tf-otel diff: {base['source']} ({base['ranks']} ranks, {base['steady_steps']} steady "
        f"steps) -> {cand['source']} ({cand['ranks']} ranks, {cand['steady_steps']} steady steps)",
        f"step time: median {_ms(verdict['baseline_median_ms'])} -> "
        f"{_ms(verdict['candidate_median_ms'])} ms ({_signed(verdict['delta_ms'])} ms, "
        f"x{verdict['ratio']}): {verdict['change'].upper()} "
        f"(noise threshold {_ms(verdict['threshold_ms'])} ms from the runs' own spread: sigma "
        f"{_ms(verdict['baseline_sigma_ms'])} / {_ms(verdict['candidate_sigma_ms'])} ms)",
    ]
    throughput = report["throughput"]
    if throughput["baseline_steps_per_s"] and throughput["candidate_steps_per_s"]:
        lines.append(
            f"throughput: {throughput['baseline_steps_per_s']:.3f} -> "
            f"{throughput['candidate_steps_per_s']:.3f} steps/s"
        )
    lines += ["", "what moved:"]
    lines += [f"  {text}" for text in report["moved"]] or ["  nothing beyond the noise"]
    lines += ["", "critical path by category (mean ms a step):"]
    rows = []
    for row in report["by_category"]:
        moved = "*" if row.get("moved") else ""
        rows.append(
            [
                row["category"],
                _ms(row["baseline_ms"]),
                _ms(row["candidate_ms"]),
                _signed(row.get("delta_ms")) + moved,
                _ms(row.get("threshold_ms")),
            ]
        )
    lines += ["  " + t for t in _table(["category", "base", "cand", "delta", "noise"], rows)]
    ranks = report["by_rank"]
    lines += ["", f"ranks (matched by {ranks['matched_by']}; own work = outside syncs, ms a step):"]
    rows = [
        [
            r["label"],
            _ms(r["baseline_path_ms"]),
            _ms(r["candidate_path_ms"]),
            _ms(r["baseline_work_ms"]),
            _ms(r["candidate_work_ms"]),
            _signed(r.get("work_delta_ms")) + ("*" if r.get("moved") else ""),
        ]
        for r in ranks["ranks"]
    ]
    header = ["rank", "path base", "path cand", "work base", "work cand", "work delta"]
    lines += ["  " + t for t in _table(header, rows)]
    names = report["names"]
    for title in ("appeared", "vanished", "changed"):
        if names[title]:
            lines.append(f"\non the path, {title} (mean ms a step):")
            lines += [
                f"  {n['category']:<13} {n['name']}: {_ms(n['baseline_ms'])} -> "
                f"{_ms(n['candidate_ms'])} ({_signed(n['delta_ms'])})"
                for n in names[title]
            ]
    findings = report["findings"]
    for title, key in (("baseline", "only_baseline"), ("candidate", "only_candidate")):
        if findings[key]:
            lines.append(f"\nfindings in the {title} only:")
            lines += [f"  [{f['severity']}] {f['summary']}" for f in findings[key]]
    if report["notes"]:
        lines.append("")
        lines += [f"note: {note}" for note in report["notes"]]
    return "\n".join(lines)
