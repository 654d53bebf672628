"""Benchmark: reading spilled rows back in marshal against portable formats.

Usage::

    .venv/bin/python bench/bench_spill_format.py --keep /tmp/bench_traces --steps 25

The spill (``tf_otel.analysis.load.spill``) keeps each trace's rows on disk and the analysis
reads them back a trace at a time, many times over a run; the native decoder writes those
pieces itself in marshal's format. This times, one format after another on the same rows,
making the pieces (dumps, the Python writer's cost) and reading them back (loads, every
analysis read), and prints one JSON line: bytes, microseconds per span, and whether the
objects the rows share (trace id, names, the resource's attributes) stay shared once read.
"""

from __future__ import annotations

import argparse
import json
import marshal
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_analysis import generate  # noqa: E402

from tf_otel.analysis.load.spill import load_spilled  # noqa: E402
from tf_otel.analysis.rules.gc_pause import paused_gc  # noqa: E402

Codec = Tuple[Callable[[Any], bytes], Callable[[bytes], Any]]


def _codecs() -> Dict[str, Codec]:
    codecs: Dict[str, Codec] = {
        "marshal": (marshal.dumps, marshal.loads),
        "pickle5": (lambda rows: pickle.dumps(rows, protocol=5), pickle.loads),
    }
    try:
        import msgspec

        # msgpack has no tuple: rows come back as lists (the analysis needs tuples)
        encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
        codecs["msgspec.msgpack"] = (encoder.encode, decoder.decode)
    except ImportError:  # pragma: no cover - depends on the environment
        pass
    try:
        import msgpack

        codecs["msgpack(use_list=False)"] = (
            msgpack.packb,
            lambda data: msgpack.unpackb(data, use_list=False, strict_map_key=False),
        )
    except ImportError:  # pragma: no cover - depends on the environment
        pass
    return codecs


def _pieces(directory: Path) -> List[List[tuple]]:
    """Every trace's rows as the spill reads them back (a list of row tuples a piece)."""
    pieces: List[List[tuple]] = []
    with load_spilled([str(directory)], progress=False, workers=1) as source:
        for trace_id in source.trace_ids():
            found = source._index[trace_id]
            for at in range(0, len(found), 4):
                number, offset, head, length = found[at : at + 4]
                pieces.append(marshal.loads(source._files.read(number, offset + head, length)))
    return pieces


def _best(function: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        function()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--keep", help="a directory of generated traces (made if empty)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    directory = Path(args.keep or tempfile.mkdtemp(prefix="tf_otel_bench_"))
    if not any(directory.glob("rank*.jsonl")):
        generate(directory, args.steps, args.ranks)
    pieces = _pieces(directory)
    spans = sum(map(len, pieces))
    results: Dict[str, Any] = {"spans": spans, "pieces": len(pieces)}
    with paused_gc():
        for name, (dumps, loads) in _codecs().items():
            blobs = [dumps(piece) for piece in pieces]
            back = loads(blobs[0])
            dump_s = _best(lambda dumps=dumps: [dumps(piece) for piece in pieces], args.repeat)
            load_s = _best(lambda loads=loads, blobs=blobs: [loads(b) for b in blobs], args.repeat)
            rows = back if isinstance(back, (list, tuple)) else []
            results[name] = {
                "bytes_per_span": round(sum(map(len, blobs)) / spans, 1),
                "dumps_us_per_span": round(dump_s / spans * 1e6, 3),
                "loads_us_per_span": round(load_s / spans * 1e6, 3),
                "rows_are_tuples": type(rows[0]) is tuple,
                # the resource's attributes: one dict for a rank's rows, or a copy a row
                "resource_shared": len(rows) > 1 and rows[0][7] is rows[1][7],
            }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
