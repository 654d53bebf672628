"""Cost of checking cross-rank message bodies on receipt (tf_otel/cluster/messages.py): the
checked ``messages.decode`` against the unchecked decode it replaced (``json.loads`` plus the
object / type test), per message type, in alternating blocks in one process (same load).
Messages are per step (an extent per rank, a step's Horovod arrivals / last arrivals, rank 0's
collective records for a rank), not per span.

    .venv/bin/python bench/bench_messages.py [--rounds 9] [--block 2000] [--collectives 50]

Prints the medians over rounds in microseconds per message, and the ratio checked / unchecked.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable, Dict, Optional

import harness


def unchecked(line: bytes) -> Optional[Dict[str, Any]]:
    """The decode before bodies were checked (kept here only to measure against)."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or not isinstance(message.get("t"), str):
        return None
    return message


def per_message_us(decode: Callable[[bytes], Any], line: bytes, block: int) -> float:
    t0 = time.perf_counter()
    for _ in range(block):
        decode(line)
    return (time.perf_counter() - t0) / block * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--block", type=int, default=2000)
    parser.add_argument("--collectives", type=int, default=50, help="tensors in a step")
    args = parser.parse_args()

    from tf_otel.cluster import messages
    from tf_otel.instrument.horovod import timeline
    from tf_otel.sources import horovod_timeline as tl

    n = args.collectives
    view = tl.RankView(1.7e15, 1.7e15 + 30.5, 1.7e15 + 90.25, 1.7e15 + 40.0, False, "tick")
    items = [
        timeline._encode(tl.Collective(f"grad_{i}", dtype="float32", shape="[256, 256]"), view)
        for i in range(n)
    ]
    ns = 1_700_000_000_000_000_000
    bodies: Dict[str, messages.Outgoing] = {
        "extent": messages.extent("keras_train", 1234, ns, ns + 9_000_000),
        "ops.window": messages.ops_window({"keras_train": 1300}, 5),
        f"hvd.a ({n} tensors)": {
            "t": messages.HVD_ARRIVALS,
            "k": "keras_train",
            "s": 1234,
            "a": {f"grad_{i}": ns + i for i in range(n)},
        },
        f"hvd.l ({n} tensors)": {
            "t": messages.HVD_LAST,
            "k": "keras_train",
            "s": 1234,
            "l": {f"grad_{i}": [ns + i, 1] for i in range(n)},
        },
        f"hvd.c ({n} collectives)": {
            "t": messages.HVD_RECORDS,
            "k": "keras_train",
            "s": 1234,
            "sh": -12345,
            "c": items,
        },
    }
    print(f"rounds {args.rounds}, block {args.block}; us per message, medians")
    print(f"{'message':26} {'bytes':>6} {'unchecked':>10} {'checked':>9} {'ratio':>6}")
    decoders: Dict[str, Callable[[bytes], Any]] = {
        "unchecked": unchecked,
        "checked": messages.decode,
    }
    for name, body in bodies.items():
        line = messages.encode(body)
        assert messages.decode(line) == unchecked(line)

        def timed(_: int, decoder: str, line: bytes = line) -> float:
            return per_message_us(decoders[decoder], line, args.block)

        times = harness.interleaved(
            list(decoders), args.rounds, timed
        )  # alternating which goes first
        b, a = statistics.median(times["unchecked"]), statistics.median(times["checked"])
        print(f"{name:26} {len(line):6d} {b:10.2f} {a:9.2f} {a / b:6.2f}")


if __name__ == "__main__":
    main()
