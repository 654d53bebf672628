"""Draw docs/guides/analysis-overlap.png: the critical path of issue 43's minimal case, where
rank 0's next op begins 40 us before its allreduce ends (a recording overlap inside the
tolerance), as ``tf-otel analyze`` walks it. The path is the analysis' own (critical_path),
not drawn by hand.

    .venv/bin/python scripts/draw_overlap.py [OUT.png]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "analysis")]

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from analysis_builders import EPOCH_NS, JobBuilder, decoded_spans  # noqa: E402

from tf_otel.analysis.path.critical_path import OVERLAP_FLOOR_NS, critical_path  # noqa: E402
from tf_otel.analysis.steps import group_steps  # noqa: E402

OVERLAP_MS = 0.04
COLOURS = {"compute": "#8ab6d6", "collective": "#f2b880"}


def _job() -> JobBuilder:
    job = JobBuilder("overlap", world_size=2)
    step = job.step(0)
    step.rank(0, 0, 115)
    step.rank(1, 0, 110)
    step.span(0, "compute", "fwd", 0, 50)
    step.span(1, "compute", "fwd", 0, 100)
    step.collective(0, "g", 50, 105)
    step.collective(1, "g", 100, 105)
    step.span(0, "compute", "apply", 105 - OVERLAP_MS, 115)
    step.span(1, "compute", "apply", 105, 110)
    return job


def main(out: Path) -> None:
    steps, _ = group_steps(decoded_spans(_job()))
    step = steps[0]
    path = critical_path(step)
    fig, (whole, zoom) = plt.subplots(1, 2, figsize=(11, 2.8), width_ratios=(3, 1.3))

    def lanes(ax):
        for rank, timeline in step.ranks.items():
            # collectives last and lower: where they overlap the next op, both show
            for span in sorted(timeline.nodes, key=lambda s: s.category == "collective"):
                a, b = (span.start_ns - EPOCH_NS) / 1e6, (span.end_ns - EPOCH_NS) / 1e6
                low = span.category == "collective"
                ax.barh(
                    rank + (0.12 if low else -0.05),
                    b - a,
                    left=a,
                    height=0.3 if low else 0.5,
                    color=COLOURS[span.category],
                    edgecolor="#555",
                    linewidth=0.6,
                    alpha=0.9,
                    label=span.category,
                )
        xs, ys = [], []
        for segment in path.segments:
            xs += [(segment.start_ns - EPOCH_NS) / 1e6, (segment.end_ns - EPOCH_NS) / 1e6]
            ys += [segment.rank, segment.rank]
        ax.plot(xs, ys, color="#c0392b", linewidth=2.2, label="critical path")
        ax.set_yticks([0, 1], ["rank 0", "rank 1"])
        ax.invert_yaxis()

    lanes(whole)
    whole.set_xlabel("ms")
    whole.set_title("the path: rank 1's compute, the allreduce, rank 0's apply", fontsize=10)
    handles, names = whole.get_legend_handles_labels()
    unique = dict(zip(names, handles))
    whole.legend(unique.values(), unique.keys(), loc="lower right", fontsize=8)
    lanes(zoom)
    tolerance = OVERLAP_FLOOR_NS / 1e6
    zoom.axvspan(
        105 - OVERLAP_MS,
        105 - OVERLAP_MS + tolerance,
        color="#27ae60",
        alpha=0.15,
        label=f"tolerance {tolerance * 1e3:.0f} us",
    )
    zoom.set_xlim(104.85, 105.15)
    zoom.set_xlabel("ms (zoomed)")
    zoom.set_title(f"apply begins {OVERLAP_MS * 1e3:.0f} us before the allreduce ends", fontsize=9)
    handles, names = zoom.get_legend_handles_labels()
    zoom.legend(
        [handles[names.index(n)] for n in names if n.startswith("tolerance")],
        [n for n in names if n.startswith("tolerance")],
        loc="lower left",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}: path by rank {path.by_rank()}, overlaps taken {path.overlaps}")


if __name__ == "__main__":
    main(
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else ROOT / "docs" / "guides" / "analysis-overlap.png"
    )
