"""Draw docs/guides/analysis-diff.png: ``tf-otel diff`` of two simulated runs (tests/analysis/
job_simulator.py: rank 2 trains 1.5x longer in the candidate), from the diff's own report:
the critical path by category and each rank's own work, baseline beside candidate, with the
noise threshold the verdict used.

    .venv/bin/python scripts/draw_diff.py [OUT.png]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "analysis")]

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from analysis_builders import decoded_spans  # noqa: E402
from job_simulator import DataParallel  # noqa: E402

from tf_otel.analysis.analyze import analyze_spans  # noqa: E402
from tf_otel.analysis.compare.diff import diff_profiles  # noqa: E402
from tf_otel.analysis.compare.profile import run_profile  # noqa: E402


def _profile(sim: DataParallel, seed: int) -> dict:
    return run_profile(analyze_spans(decoded_spans(sim.job(jitter_us=50, seed=seed))))


def main(out: Path) -> None:
    base = _profile(DataParallel(ranks=4, steps=30, input_ms=2.0, seed=1), 2)
    cand = _profile(DataParallel(ranks=4, steps=30, input_ms=2.0, slow={2: 1.5}, seed=9), 3)
    report = diff_profiles(base, cand)
    rows = [r for r in report["by_category"] if r.get("measured")]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.2))
    xs = range(len(rows))
    left.bar([x - 0.2 for x in xs], [r["baseline_ms"] for r in rows], 0.4, label="baseline")
    left.bar([x + 0.2 for x in xs], [r["candidate_ms"] for r in rows], 0.4, label="candidate")
    for x, row in zip(xs, rows):
        if row["moved"]:
            left.annotate(
                f"{row['delta_ms']:+.1f} ms",
                (x + 0.2, row["candidate_ms"]),
                ha="center",
                va="bottom",
                fontsize=8,
                color="#c0392b",
            )
    left.set_xticks(list(xs), [r["category"] for r in rows], fontsize=8, rotation=20)
    left.set_ylabel("ms a step on the critical path")
    verdict = report["verdict"]
    left.set_title(
        f"step {verdict['baseline_median_ms']:.1f} -> {verdict['candidate_median_ms']:.1f} ms: "
        f"{verdict['change']} (noise {verdict['threshold_ms']:.2f} ms)",
        fontsize=9,
    )
    left.legend(fontsize=8)
    ranks = report["by_rank"]["ranks"]
    xs = range(len(ranks))
    right.bar([x - 0.2 for x in xs], [r["baseline_work_ms"] for r in ranks], 0.4)
    right.bar([x + 0.2 for x in xs], [r["candidate_work_ms"] for r in ranks], 0.4)
    for x, row in zip(xs, ranks):
        if row["moved"]:
            right.annotate(
                f"{row['work_delta_ms']:+.1f} ms",
                (x + 0.2, row["candidate_work_ms"]),
                ha="center",
                va="bottom",
                fontsize=8,
                color="#c0392b",
            )
    right.set_xticks(list(xs), [r["label"] for r in ranks], fontsize=8)
    right.set_ylabel("own work, ms a step")
    right.set_title(report["moved"][0] if report["moved"] else "nothing moved", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}: {report['moved']}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "guides" / "analysis-diff.png")
