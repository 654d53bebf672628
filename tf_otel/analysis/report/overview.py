"""The HTML report's overview, built to stay readable at 64+ ranks x 10,000+ steps.

Usage::

    data = overview_from_result(result)          # or Overview(...) filled by hand
    html_fragment = render_overview(data, pictured={"17", "42"})

Three parts, each bounded in size whatever the run's length (steps are binned to at most
``MAX_COLUMNS`` columns, ranks to at most ``MAX_ROWS`` rows):

- step time over the run: an SVG band (min..max per column) with the median line, warm-up
  shaded, straggler steps marked red and outliers orange;
- lateness heatmap, ranks x steps: each cell the rank's lateness in the step (its legs on the
  critical path minus the other ranks' median, see ``critical_path.lateness_by_rank``) relative
  to the run's straggler threshold (white: on time, red: at or beyond the threshold; the worst
  value in a binned cell), drawn as an inline PNG (stdlib zlib; no scripts, no files);
- top stragglers: ranks by what-if saving, and the straggler steps by excess, linking to the
  step's swimlane where it is pictured; a cause ``compute+`` is compute on a step that did not
  measure input or communication (``measured.cause_label``).
"""

from __future__ import annotations

import base64
import html
import statistics
import struct
import zlib
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from tf_otel.analysis.measured import cause_label
from tf_otel.analysis.result import AnalysisResult

MAX_COLUMNS = 1000
MAX_ROWS = 256
PLOT_WIDTH = 1100
PLOT_HEIGHT = 220
MARGIN_LEFT = 70
TOP_RANKS = 10
TOP_STEPS = 20


@dataclass
class Overview:
    """Per-step facts the overview draws (lists indexed like ``labels``, in step order)."""

    title: str
    labels: List[str]
    durations_ns: List[int]
    ranks: List[int]
    # rank -> per-step lateness in ns (None: the rank has no spans in that step)
    lateness: Dict[int, List[Optional[int]]]
    threshold_ns: int
    warmup: List[bool] = field(default_factory=list)
    outlier: List[bool] = field(default_factory=list)
    # per step: (rank, excess_ns, saving_ns, category) of its straggler, or None
    straggler: List[Optional[Tuple[int, int, int, str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.labels)
        self.warmup = self.warmup or [False] * n
        self.outlier = self.outlier or [False] * n
        self.straggler = self.straggler or [None] * n


def overview_from_result(result: AnalysisResult) -> Overview:
    ranks = result.ranks()
    lateness: Dict[int, List[Optional[int]]] = {rank: [] for rank in ranks}
    stragglers: List[Optional[Tuple[int, int, int, str]]] = []
    for step in result.steps:
        values = step.path.lateness_by_rank()
        for rank in ranks:
            if rank in values:
                lateness[rank].append(values[rank])
            else:
                lateness[rank].append(0 if rank in step.trace.ranks else None)
        found = step.straggler
        stragglers.append(
            None
            if found is None
            else (
                found.rank,
                found.excess_ns,
                found.saving_ns,
                cause_label(found.category, step.measured),
            )
        )
    return Overview(
        title=f"job {result.job_id}",
        labels=[step.label for step in result.steps],
        durations_ns=[step.trace.duration_ns for step in result.steps],
        ranks=ranks,
        lateness=lateness,
        threshold_ns=result.stragglers.noise.threshold_ns,
        warmup=[step.warmup for step in result.steps],
        outlier=[step.outlier for step in result.steps],
        straggler=stragglers,
    )


def _bins(count: int, limit: int) -> List[Tuple[int, int]]:
    """[start, stop) index ranges: ``count`` items in at most ``limit`` bins."""
    bins = min(count, limit)
    return [(i * count // bins, (i + 1) * count // bins) for i in range(bins)]


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def step_time_svg(data: Overview) -> str:
    n = len(data.durations_ns)
    if not n:
        return "<p>no steps</p>"
    columns = _bins(n, MAX_COLUMNS)
    steady = [d for d, w in zip(data.durations_ns, data.warmup) if not w] or data.durations_ns
    # the y axis fits the steady steps (warm-up can be 100x longer): cap at 3x their p99
    ordered = sorted(steady)
    top = max(1, min(ordered[-1], 3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]))
    width = PLOT_WIDTH - MARGIN_LEFT - 10
    x_of = lambda i: MARGIN_LEFT + width * i / len(columns)  # noqa: E731
    y_of = lambda v: 10 + (PLOT_HEIGHT - 30) * (1 - min(v, top) / top)  # noqa: E731
    out = [
        f'<svg id="step-time" xmlns="http://www.w3.org/2000/svg" width="{PLOT_WIDTH}" '
        f'height="{PLOT_HEIGHT}" font-family="sans-serif" font-size="11">'
    ]
    lows, highs, mids = [], [], []
    for i, (a, b) in enumerate(columns):
        values = data.durations_ns[a:b]
        x = x_of(i + 0.5)
        lows.append(f"{x:.1f},{y_of(min(values)):.1f}")
        highs.append(f"{x:.1f},{y_of(max(values)):.1f}")
        mids.append(f"{x:.1f},{y_of(statistics.median(values)):.1f}")
        if any(data.warmup[a:b]):
            out.append(
                f'<rect x="{x_of(i):.1f}" y="10" width="{max(1.0, x_of(i + 1) - x_of(i)):.1f}" '
                f'height="{PLOT_HEIGHT - 30}" fill="#eee"><title>warm-up</title></rect>'
            )
    out.append(
        f'<polygon points="{" ".join(highs + lows[::-1])}" fill="#4e79a7" fill-opacity="0.25"/>'
    )
    out.append(f'<polyline points="{" ".join(mids)}" fill="none" stroke="#4e79a7"/>')
    for i, (a, b) in enumerate(columns):
        flagged = [j for j in range(a, b) if data.straggler[j] is not None]
        if flagged:
            worst = max(flagged, key=lambda j: data.durations_ns[j])
            rank, excess, _, category = data.straggler[worst]  # type: ignore[misc]
            out.append(
                f'<circle class="straggler-mark" cx="{x_of(i + 0.5):.1f}" '
                f'cy="{y_of(data.durations_ns[worst]):.1f}" r="3" fill="#e15759"><title>'
                f"step {html.escape(data.labels[worst])}: {_ms(data.durations_ns[worst])} ms, "
                f"straggler rank {rank} +{_ms(excess)} ms ({html.escape(category)})"
                "</title></circle>"
            )
        elif any(data.outlier[a:b]):
            out.append(
                f'<circle cx="{x_of(i + 0.5):.1f}" cy="{PLOT_HEIGHT - 22}" r="2" fill="#f28e2b"/>'
            )
    out.append(
        f'<text x="{MARGIN_LEFT - 4}" y="14" text-anchor="end">{_ms(top)} ms</text>'
        f'<text x="{MARGIN_LEFT - 4}" y="{PLOT_HEIGHT - 20}" text-anchor="end">0</text>'
        f'<text x="{MARGIN_LEFT}" y="{PLOT_HEIGHT - 4}">step {html.escape(data.labels[0])}</text>'
        f'<text x="{PLOT_WIDTH - 10}" y="{PLOT_HEIGHT - 4}" text-anchor="end">'
        f"step {html.escape(data.labels[-1])}</text></svg>"
    )
    return "".join(out)


def png_rgb(width: int, height: int, rows: Sequence[bytes]) -> bytes:
    """A truecolour PNG from ``height`` rows of ``3 * width`` bytes."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body))
            + kind
            + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        )

    raw = b"".join(b"\x00" + row for row in rows)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def _colour(ratio: Optional[float]) -> Tuple[int, int, int]:
    if ratio is None:
        return (210, 210, 210)  # no spans from this rank
    ratio = max(0.0, min(1.0, ratio))
    if ratio < 0.25:  # the run's usual jitter stays white
        return (255, 255, 255)
    if ratio < 0.5:  # white -> amber at half the threshold
        t = (ratio - 0.25) / 0.25
        return (255, int(255 - 55 * t), int(255 - 175 * t))
    t = (ratio - 0.5) / 0.5  # amber -> red at the threshold
    return (int(255 - 30 * t), int(200 - 150 * t), int(80 - 40 * t))


def heatmap_png(data: Overview) -> Tuple[bytes, int, int]:
    columns = _bins(len(data.labels), MAX_COLUMNS)
    row_bins = _bins(len(data.ranks), MAX_ROWS)
    scale = max(1, data.threshold_ns)
    rows = []
    for a, b in row_bins:
        series = [data.lateness[rank] for rank in data.ranks[a:b]]
        line = bytearray()
        for c0, c1 in columns:
            worst: Optional[int] = None
            for values in series:
                for value in values[c0:c1]:
                    if value is not None and (worst is None or value > worst):
                        worst = value
            if all(data.warmup[c0:c1]):
                line += bytes((235, 235, 245))
            else:
                line += bytes(_colour(None if worst is None else worst / scale))
        rows.append(bytes(line))
    return png_rgb(len(columns), len(rows), rows), len(columns), len(rows)


def heatmap_html(data: Overview) -> str:
    if not data.labels or not data.ranks:
        return "<p>no ranks</p>"
    png, columns, rows = heatmap_png(data)
    row_px = max(2, min(14, 420 // rows))
    width = PLOT_WIDTH - MARGIN_LEFT - 10
    ranks = data.ranks
    rank_note = (
        f"ranks {ranks[0]}..{ranks[-1]}"
        if rows == len(ranks)
        else f"ranks {ranks[0]}..{ranks[-1]}, {len(ranks) // rows}+ per row"
    )
    step_note = (
        "one column per step"
        if columns == len(data.labels)
        else f"{len(data.labels) // columns}+ steps per column (the worst shown)"
    )
    labels = "".join(
        f'<div style="position:absolute;right:4px;top:{i * row_px}px;font-size:10px;'
        f'line-height:{row_px}px">{ranks[i * len(ranks) // rows]}</div>'
        for i in range(0, rows, max(1, rows // 16))
    )
    return (
        f'<div id="heatmap" style="position:relative;height:{rows * row_px}px">'
        f'<div style="position:absolute;left:0;top:0;width:{MARGIN_LEFT}px">{labels}</div>'
        f'<img alt="lateness heatmap, ranks x steps" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode()}" style="position:absolute;left:{MARGIN_LEFT}px;'
        f"top:0;width:{width}px;height:{rows * row_px}px;image-rendering:pixelated;"
        f'border:1px solid #ccc"></div>'
        f"<p><small>rows: {rank_note}; columns: {step_note}, steps "
        f"{html.escape(data.labels[0])}..{html.escape(data.labels[-1])}. White: on time "
        f"(under a quarter of the threshold); amber: half the straggler threshold "
        f"({_ms(data.threshold_ns)} ms); red: at or beyond it; grey: no spans; blue-grey: "
        "warm-up.</small></p>"
    )


def _link(label: str, pictured: Set[str]) -> str:
    text = html.escape(label)
    return f"<a href='#step-{text}'>{text}</a>" if label in pictured else text


def top_stragglers_html(data: Overview, pictured: Iterable[str] = ()) -> str:
    pictured = set(pictured)
    by_rank: Dict[int, List[int]] = {}
    for index, found in enumerate(data.straggler):
        if found is not None:
            by_rank.setdefault(found[0], []).append(index)
    if not by_rank:
        return "<p id='top-stragglers'>no straggler beyond the run's noise</p>"
    steady = sum(1 for w in data.warmup if not w) or 1

    def saving(rank: int) -> int:
        return sum(data.straggler[i][2] for i in by_rank[rank])  # type: ignore[index,misc]

    rows = []
    for rank in sorted(by_rank, key=lambda r: (-saving(r), r))[:TOP_RANKS]:
        steps = by_rank[rank]
        categories: Dict[str, int] = {}
        for i in steps:
            category = data.straggler[i][3]  # type: ignore[index]
            categories[category] = categories.get(category, 0) + 1
        worst = sorted(steps, key=lambda i: -data.straggler[i][1])[:5]  # type: ignore[index]
        rows.append(
            f"<tr><td>{rank}</td><td>{len(steps)} ({100 * len(steps) / steady:.1f}%)</td>"
            f"<td>{_ms(sum(data.straggler[i][1] for i in steps))}</td>"  # type: ignore[index,misc]
            f"<td>{_ms(saving(rank))}</td>"
            f"<td>{html.escape(', '.join(f'{c} {n}' for c, n in sorted(categories.items())))}</td>"
            f"<td>{', '.join(_link(data.labels[i], pictured) for i in worst)}</td></tr>"
        )
    flagged = [i for i, found in enumerate(data.straggler) if found is not None]
    flagged.sort(key=lambda i: -data.straggler[i][1])  # type: ignore[index]
    step_rows = [
        f"<tr><td>{_link(data.labels[i], pictured)}</td><td>{_ms(data.durations_ns[i])}</td>"
        f"<td>{data.straggler[i][0]}</td><td>{_ms(data.straggler[i][1])}</td>"  # type: ignore[index]
        f"<td>{html.escape(data.straggler[i][3])}</td></tr>"  # type: ignore[index]
        for i in flagged[:TOP_STEPS]
    ]
    more = f"<p>... {len(flagged) - TOP_STEPS} more steps</p>" if len(flagged) > TOP_STEPS else ""
    held = (
        "<p><small>compute+: compute on a step that did not measure input or communication, "
        "so it holds them too</small></p>"
        if any(found is not None and found[3].endswith("+") for found in data.straggler)
        else ""
    )
    return (
        "<table id='top-stragglers'><tr><th>rank</th><th>straggler steps</th>"
        "<th>excess ms</th><th>what-if saving ms</th><th>causes</th><th>worst steps</th></tr>"
        + "".join(rows)
        + "</table><h3>Worst straggler steps</h3><table id='straggler-steps'><tr><th>step</th>"
        "<th>ms</th><th>rank</th><th>excess ms</th><th>cause</th></tr>"
        + "".join(step_rows)
        + "</table>"
        + more
        + held
    )


def render_overview(data: Overview, pictured: Iterable[str] = ()) -> str:
    steady = [d for d, w in zip(data.durations_ns, data.warmup) if not w]
    median = statistics.median(steady) if steady else 0
    warm = [label for label, w in zip(data.labels, data.warmup) if w]
    named = sum(1 for found in data.straggler if found is not None)
    facts = (
        f"{len(data.labels)} steps, {len(data.ranks)} ranks; median step {_ms(median)} ms; "
        f"{named} straggler steps beyond the run's noise (threshold {_ms(data.threshold_ns)} ms)"
    )
    if warm:
        facts += f"; warm-up: steps {html.escape(', '.join(warm[:10]))}"
    return (
        "<section id='overview'><h2>Overview</h2>"
        f"<p>{facts}</p>"
        "<h3>Step time over the run</h3>"
        + step_time_svg(data)
        + "<h3>Lateness, ranks &times; steps</h3>"
        + heatmap_html(data)
        + "<h3>Top stragglers</h3>"
        + top_stragglers_html(data, pictured)
        + "</section>"
    )
