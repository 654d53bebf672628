"""The HTML report at scale (64 ranks x 10,000 steps), checked in a real headless Chromium.

Chromium is Debian's ``chromium`` package (installed by scripts/install.sh); the page is loaded
with ``--dump-dom`` and the DOM checked for the overview's parts. No timing assertions.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from analysis_builders import decoded_spans, horovod_like_run, synthetic_overview

from tf_otel.analysis.analyze import analyze_spans
from tf_otel.analysis.report.html import render_html, render_overview_page
from tf_otel.analysis.report.overview import MAX_COLUMNS, heatmap_png


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed: apt-get install -y chromium (scripts/install.sh)")
    return path


def dump_dom(page: Path) -> str:
    done = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def png_size(png: bytes):
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    return width, height


def test_png_heatmap_is_a_valid_image_of_bounded_size():
    data = synthetic_overview(ranks=64, steps=10_000)
    png, columns, rows = heatmap_png(data)
    assert png_size(png) == (columns, rows) == (MAX_COLUMNS, 64)
    body = png[8:]
    idat = b""
    while body:
        (length,) = struct.unpack(">I", body[:4])
        kind, chunk = body[4:8], body[8 : 8 + length]
        assert struct.unpack(">I", body[8 + length : 12 + length])[0] == zlib.crc32(kind + chunk)
        if kind == b"IDAT":
            idat += chunk
        body = body[12 + length :]
    assert len(zlib.decompress(idat)) == rows * (1 + 3 * columns)


def test_64_ranks_x_10000_steps_overview_in_chromium(tmp_path: Path):
    data = synthetic_overview(ranks=64, steps=10_000)
    page = tmp_path / "big.html"
    page.write_text(render_overview_page(data))
    assert page.stat().st_size < 2_000_000  # bounded: binned, not one element per cell
    dom = dump_dom(page)
    for part in ('id="overview"', 'id="step-time"', 'id="heatmap"', 'id="top-stragglers"'):
        assert part in dom, part
    assert 'src="data:image/png;base64,' in dom
    assert dom.count('class="straggler-mark"') <= MAX_COLUMNS
    top = dom.split('id="top-stragglers"', 1)[1]
    assert "<td>17</td>" in top.split("</tr>", 2)[1]  # rank 17 costs the most


def test_report_of_an_analysis_in_chromium(tmp_path: Path):
    slow = {6: (2, 40.0, "input"), 11: (1, 40.0, "before_step")}
    result = analyze_spans(decoded_spans(horovod_like_run(steps=16, jitter_ms=1.0, slow=slow)))
    page = tmp_path / "report.html"
    page.write_text(render_html(result, max_pictures=3))
    dom = dump_dom(page)
    overview, steps = dom.index('id="overview"'), dom.index('id="steps"')
    assert overview < dom.index('id="findings"') < steps
    assert dom.count("<svg") == 1 + 3  # the step-time plot, three swimlanes
    assert 'id="step-6"' in dom and 'id="step-11"' in dom  # the straggler steps are pictured
    assert 'href="#step-6"' in dom  # linked from the top-stragglers table
