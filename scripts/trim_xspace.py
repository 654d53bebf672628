#!/usr/bin/env python3
"""Trim a TF / JAX profiler XSpace into a small test fixture, with tf_otel's own parser.

Usage::

    .venv/bin/python scripts/trim_xspace.py IN.xplane.pb[.gz] OUT.xplane.pb.gz \\
        [--from-ms 0] [--window-ms 60] [--max-events 3000]

Keeps the events that start inside [profile start + from, + window) on the GPU planes and on the
host plane's lines that hold ops (``tf_Compute``, ``tf_data``, the Python thread ...), at most
``--max-events`` per line; drops empty lines and the event / stat metadata nothing refers to
any more. Stats, names and times of what is kept are untouched.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path
from typing import Any, Set

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tf_otel.sources.xplane import parse_xspace  # noqa: E402


def _read(path: str) -> bytes:
    data = Path(path).read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def trim(space: Any, from_ps: int, window_ps: int, max_events: int) -> Any:
    start = None
    for plane in space.planes:
        for line in plane.lines:
            for ev in line.events:
                t = line.timestamp_ns * 1000 + ev.offset_ps
                start = t if start is None else min(start, t)
    if start is None:
        return space
    lo, hi = start + from_ps, start + from_ps + window_ps
    for plane in space.planes:
        keep_lines = []
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            kept = [ev for ev in line.events if lo <= base + ev.offset_ps < hi][:max_events]
            if kept:
                del line.events[:]
                line.events.extend(kept)
                keep_lines.append(line)
        del plane.lines[:]
        plane.lines.extend(keep_lines)
        used_events: Set[int] = set()
        used_stats: Set[int] = set(st.metadata_id for st in plane.stats)
        for line in plane.lines:
            for ev in line.events:
                used_events.add(ev.metadata_id)
                used_stats.update(st.metadata_id for st in ev.stats)
                used_stats.update(
                    st.ref_value for st in ev.stats if st.WhichOneof("value") == "ref_value"
                )
        for md in plane.event_metadata.values():
            used_stats.update(st.metadata_id for st in md.stats)
        for key in [k for k in plane.event_metadata if k not in used_events]:
            del plane.event_metadata[key]
        for key in [k for k in plane.stat_metadata if k not in used_stats]:
            del plane.stat_metadata[key]
    return space


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("src")
    p.add_argument("dest")
    p.add_argument("--from-ms", type=float, default=0.0)
    p.add_argument("--window-ms", type=float, default=60.0)
    p.add_argument("--max-events", type=int, default=3000)
    a = p.parse_args()
    space = trim(
        parse_xspace(_read(a.src)),
        int(a.from_ms * 1e9),
        int(a.window_ms * 1e9),
        a.max_events,
    )
    data = space.SerializeToString()
    Path(a.dest).write_bytes(gzip.compress(data, 9))
    print(f"{a.dest}: {len(data)} bytes, {Path(a.dest).stat().st_size} gzipped")


if __name__ == "__main__":
    main()
