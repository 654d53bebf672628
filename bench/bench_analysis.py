"""Benchmark: `tf-otel analyze` on 1,000 steps x 8 ranks x 200 spans of OTLP-JSON (goal <= 10 s).

Usage::

    .venv/bin/python bench/bench_analysis.py                 # writes into a temp dir
    .venv/bin/python bench/bench_analysis.py --steps 100 --keep /tmp/bench_traces

Generates one OTLP-JSON file per rank (as TF_OTEL_FILE does; 512 spans per TracesData line,
as the batch span processor exports), each step: a step span, an input span, 150 compute ops,
16 collectives each with a wait and a transfer child (200 spans per rank per step), plus rank
0's step root; rank 3 is 10 ms late in every 10th step. Times load, analysis and the JSON report
separately, checks the straggler steps were found, and prints one JSON line of results.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tf_otel.analysis.analyze import analyze_source, analyze_spans  # noqa: E402
from tf_otel.analysis.engine import open_engine  # noqa: E402
from tf_otel.analysis.load import _json, decoders  # noqa: E402
from tf_otel.analysis.load.files import load_paths, requested_workers  # noqa: E402
from tf_otel.analysis.load.spill import load_spilled  # noqa: E402
from tf_otel.analysis.report.json_report import to_json  # noqa: E402
from tf_otel.analysis.rules.gc_pause import paused_gc  # noqa: E402

EPOCH_NS = 1_700_000_000 * 10**9
COMPUTE_OPS = 150
COLLECTIVES = 16
STEP_NS = 100_000_000
DELAY_NS = 10_000_000
SLOW_RANK = 3
BATCH = 512


def _attr(key, value):
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value}}


def _id(text: str, size: int) -> str:
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


def _span(trace, span_id, parent, name, start, end, attrs):
    return {
        "traceId": trace,
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": [_attr(k, v) for k, v in attrs.items()],
        "status": {},
    }


def rank_step_spans(job, step, rank, world):
    trace = _id(f"{job}/step/{step}", 16)
    root = _id(f"{job}/step/{step}/root", 8)
    base = EPOCH_NS + step * (STEP_NS + 20_000_000)
    late = DELAY_NS if (step % 10 == 0 and rank == SLOW_RANK) else 0
    delay = DELAY_NS if step % 10 == 0 else 0
    common = {
        "tf_otel.rank": rank,
        "tf_otel.step": step,
        "tf_otel.clock.offset_ns": 0,
        "tf_otel.clock.uncertainty_ns": 20_000,
    }
    step_id = _id(f"{trace}/{rank}/step", 8)
    end = base + STEP_NS + delay
    spans = [
        _span(
            trace,
            step_id,
            root,
            "train_function",
            base,
            end,
            {"tf_otel.category": "step", "tf_otel.step.kind": "tf_function", **common},
        )
    ]
    t = base + 2_000_000
    spans.append(
        _span(
            trace,
            _id(f"{trace}/{rank}/in", 8),
            step_id,
            "IteratorGetNext",
            base,
            t,
            {"tf_otel.category": "input", **common},
        )
    )
    op_ns = (60_000_000 + rank * 13_000) // COMPUTE_OPS
    per_sync = COMPUTE_OPS // COLLECTIVES
    sync_end = t
    for op in range(COMPUTE_OPS):
        start = max(t, sync_end) if op % per_sync == 0 else t
        t = start + op_ns + (late if op == 0 else 0)
        spans.append(
            _span(
                trace,
                _id(f"{trace}/{rank}/op{op}", 8),
                step_id,
                f"MatMul_{op}",
                start,
                t,
                {"tf_otel.category": "compute", "tensorflow.op.type": "MatMul", **common},
            )
        )
        if op % per_sync == per_sync - 1 and op // per_sync < COLLECTIVES:
            k = op // per_sync
            arrive = t
            sync_end = base + 2_000_000 + (k + 1) * 3_900_000 + 1_000_000 + delay
            coll = _id(f"{trace}/{rank}/c{k}", 8)
            attrs = {
                "tf_otel.category": "collective",
                "horovod.op": "allreduce",
                "tf_otel.collective.key": f"s{step}/grad{k}",
                **common,
            }
            spans.append(
                _span(
                    trace, coll, step_id, f"allreduce.grad{k}", arrive, max(arrive, sync_end), attrs
                )
            )
            mid = max(arrive, sync_end - 500_000)
            spans.append(
                _span(
                    trace,
                    _id(f"{trace}/{rank}/w{k}", 8),
                    coll,
                    "wait",
                    arrive,
                    mid,
                    {"tf_otel.category": "collective.wait", **common},
                )
            )
            spans.append(
                _span(
                    trace,
                    _id(f"{trace}/{rank}/x{k}", 8),
                    coll,
                    "transfer",
                    mid,
                    max(mid, sync_end),
                    {"tf_otel.category": "collective.transfer", **common},
                )
            )
    spans = spans[:200]
    if rank == 0:
        spans.append(
            _span(
                trace,
                root,
                "",
                f"step {step}",
                base,
                end,
                {
                    "tf_otel.category": "step.root",
                    "tf_otel.rank": 0,
                    "tf_otel.step": step,
                    "tf_otel.world_size": world,
                },
            )
        )
    return spans


def generate(directory: Path, steps: int, ranks: int, job: str = "bench-job") -> int:
    directory.mkdir(parents=True, exist_ok=True)
    total = 0
    for rank in range(ranks):
        resource = {
            "attributes": [
                _attr("service.name", "bench.py"),
                _attr("host.name", f"node{rank // 4}"),
                _attr("tf_otel.rank", rank),
                _attr("tf_otel.world_size", ranks),
                _attr("tf_otel.job.id", job),
            ]
        }
        with open(directory / f"rank{rank}.jsonl", "w") as handle:
            pending = []
            for step in range(steps):
                pending.extend(rank_step_spans(job, step, rank, ranks))
                while len(pending) >= BATCH or (step == steps - 1 and pending):
                    batch, pending = pending[:BATCH], pending[BATCH:]
                    total += len(batch)
                    document = {
                        "resourceSpans": [
                            {
                                "resource": resource,
                                "scopeSpans": [{"scope": {"name": "tf_otel"}, "spans": batch}],
                            }
                        ]
                    }
                    handle.write(json.dumps(document, separators=(",", ":")) + "\n")
    return total


def _children_cpu_s() -> float:
    """CPU seconds of finished child processes (the load's worker processes)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_mb(who: int) -> float:
    """Peak resident memory (Linux: ru_maxrss in KiB) of this process, or of the largest
    finished child process."""
    return round(resource.getrusage(who).ru_maxrss / 1024, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--keep", help="generate into (or reuse) this directory")
    parser.add_argument(
        "--workers", type=int, help="worker processes (TF_OTEL_ANALYZE_WORKERS; 0: automatic)"
    )
    parser.add_argument("--scheduler", help="a Dask scheduler address (default: this machine)")
    parser.add_argument(
        "--engine",
        choices=("spill", "memory"),
        default="spill",
        help="spill: trace files kept on disk by trace, one step in memory (the CLI's way); "
        "memory: every span loaded first",
    )
    parser.add_argument(
        "--decoder",
        choices=decoders.DECODERS,
        default=decoders.fastest(),
        help="the fastest OTLP-JSON line decoder to use (native: tf_otel_native, built by "
        "make install; in-process runs only, --workers 1)",
    )
    args = parser.parse_args()
    if args.decoder not in decoders.available():
        parser.error(f"--decoder {args.decoder}: not built or installed here (make install)")
    decoders.CHOICE = args.decoder
    directory = Path(args.keep or tempfile.mkdtemp(prefix="tf_otel_bench_"))
    if not any(directory.glob("rank*.jsonl")):
        generate(directory, args.steps, args.ranks)
    size_mb = sum(p.stat().st_size for p in directory.glob("*.jsonl")) / 1e6

    # as the CLI does: no cyclic GC while the run makes millions of acyclic objects
    with paused_gc():
        c0, t0 = time.process_time(), time.perf_counter()
        w0 = _children_cpu_s()
        size = int(size_mb * 1e6)
        with open_engine(requested_workers(args.workers), args.scheduler, size) as engine:
            kind = type(engine).__name__
            workers = engine.workers
            if args.engine == "memory":
                spans = load_paths([str(directory)], progress=False, engine=engine)
                count = len(spans)
            else:
                source = load_spilled([str(directory)], progress=False, engine=engine)
                count = source.span_count
            c1, t1 = time.process_time(), time.perf_counter()
            if args.engine == "memory":
                result = analyze_spans(spans, source=str(directory))
            else:
                # as the CLI runs it without --with-path: each step's path totals kept
                result = analyze_source(
                    source, source=str(directory), engine=engine, keep_segments=False
                )
                source.close()
            c2, t2 = time.process_time(), time.perf_counter()
            peak_analysis = _peak_rss_mb(resource.RUSAGE_SELF)  # before the report is built
            report = json.dumps(to_json(result))
            c3, t3 = time.process_time(), time.perf_counter()
        workers_cpu = _children_cpu_s() - w0  # the engine's processes, once they ended

    # the checks read what is in memory (reading the steps back would count in a profile)
    stragglers = result.stragglers.step_stragglers
    found = sorted(result.step_number(key) or 0 for key in stragglers)
    # what the input holds (a reused --keep directory was made with its own --steps/--ranks)
    steps = len(result.steps)
    ranks_in = max((len(d.ranks) for d in result.digests()), default=0)
    expected = list(range(0, steps, 10))
    ranks = {s.rank for s in stragglers.values()}
    print(
        json.dumps(
            {
                "steps": steps,
                "ranks": ranks_in,
                "engine": args.engine,
                "spans": count,
                "input_mb": round(size_mb, 1),
                "json_parser": _json.PARSER,
                "fast_decoder": args.decoder if args.decoder != "reference" else None,
                "load_s": round(t1 - t0, 2),
                "analysis_s": round(t2 - t1, 2),
                "json_report_s": round(t3 - t2, 2),
                "total_s": round(t3 - t0, 2),
                "cpu_load_s": round(c1 - c0, 2),
                "cpu_workers_s": round(workers_cpu, 2),
                "cpu_analysis_s": round(c2 - c1, 2),
                "cpu_json_report_s": round(c3 - c2, 2),
                "cpu_total_s": round(c3 - c0 + workers_cpu, 2),
                "spans_per_cpu_s": round(count / (c3 - c0 + workers_cpu)),
                "peak_rss_analysis_mb": peak_analysis,
                "peak_rss_mb": _peak_rss_mb(resource.RUSAGE_SELF),
                "peak_rss_workers_mb": _peak_rss_mb(resource.RUSAGE_CHILDREN),
                "engine_kind": kind,
                # the same input must give the same report on every engine
                "report_md5": hashlib.md5(report.encode()).hexdigest(),
                "workers": workers,
                "load_average_1m": round(os.getloadavg()[0], 1),
                "cpus": os.cpu_count(),
                "stragglers_found_exactly": found == expected and ranks == {SLOW_RANK},
                "python": platform.python_version(),
                "machine": platform.machine(),
            }
        )
    )
    return 0 if found == expected else 1


if __name__ == "__main__":
    sys.exit(main())
