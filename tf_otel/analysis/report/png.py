"""``--png DIR``: one swimlane PNG per pictured step, drawn with matplotlib (optional extra).

Usage::

    require_matplotlib()                    # AnalysisError with the install hint if missing
    paths = write_pngs(result, Path("out"), max_pictures=20)
"""

from __future__ import annotations

from pathlib import Path
from typing import List

from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.report import notable_steps
from tf_otel.analysis.report.html import COLOURS
from tf_otel.analysis.result import AnalysisResult, StepResult


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise AnalysisError(
            "--png needs matplotlib, which is not installed (pip install matplotlib); "
            "--html draws the same swimlanes without it"
        ) from None


def _draw(step: StepResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    trace = step.trace
    origin = trace.start_ns
    lanes = sorted(set(trace.expected_ranks) | set(trace.ranks))
    figure, axes = plt.subplots(figsize=(12, 0.6 * len(lanes) + 1.2))
    for lane, rank in enumerate(lanes):
        timeline = trace.ranks.get(rank)
        for span in timeline.nodes if timeline else ():
            axes.broken_barh(
                [((span.start_ns - origin) / 1e6, span.duration_ns / 1e6)],
                (lane - 0.3, 0.6),
                facecolors=COLOURS.get(span.category, "#999"),
                alpha=0.55,
            )
    lane_of = {rank: i for i, rank in enumerate(lanes)}
    for segment in step.path.segments:
        axes.broken_barh(
            [((segment.start_ns - origin) / 1e6, segment.duration_ns / 1e6)],
            (lane_of[segment.rank] - 0.3, 0.6),
            facecolors=COLOURS.get(segment.category, "#999"),
            edgecolors="black",
            linewidth=1.5,
        )
    shown = {span.category for t in trace.ranks.values() for span in t.nodes}
    shown |= {segment.category for segment in step.path.segments}
    handles = [
        Patch(facecolor=COLOURS.get(category, "#999"), label=category)
        for category in COLOURS
        if category in shown
    ]
    if handles:
        axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    axes.set_yticks(range(len(lanes)))
    axes.set_yticklabels([f"rank {rank}" for rank in lanes])
    axes.invert_yaxis()
    axes.set_xlabel("ms since step start (black outline: critical path)")
    axes.set_title(f"step {step.label}: {trace.duration_ns / 1e6:.3f} ms")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_pngs(result: AnalysisResult, directory: Path, max_pictures: int = 20) -> List[Path]:
    require_matplotlib()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise AnalysisError(f"{directory}: cannot create ({error})") from None
    written = []
    for step in notable_steps(result, max_pictures):
        target = directory / f"step_{step.label.replace('#', 'n')}.png"
        _draw(result.with_spans(step), target)
        written.append(target)
    return written
