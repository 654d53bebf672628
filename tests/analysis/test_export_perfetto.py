"""`tf-otel export`: steps as a Chrome trace that Perfetto loads — one process per rank, a slice per
span with the span's duration, collectives as flows between ranks, selection and bad input.

Every export here is loaded by Perfetto's own trace processor through the PyPI ``perfetto``
client, and the tables it builds (``slice`` joined with ``thread`` and ``process``, ``flow``,
``stats``) are checked against the spans. The client's native ``trace_processor_shell`` is
downloaded on first use from a host that no package registry mirrors, so the engine is the
WebAssembly build of the same trace processor that the Perfetto UI runs, which
scripts/install.sh unpacks into .venv/share/perfetto-wasm; scripts/trace_processor_wasm.js
serves it to the client over the shell's HTTP interface. A native binary is used instead when
``TRACE_PROCESSOR_SHELL`` names one. ``import_like_perfetto`` below restates the rules of the
JSON importer (src/trace_processor/importers/json) that the export relies on, strictly (a
violation fails): ``ts``/``dur`` in µs to ns as ``_ns`` does, complete events nested per
thread, flow events bound to the innermost open slice at their time and only when their start
comes first; the tests check that it reads each export as the trace processor does.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from analysis_builders import JobBuilder

from tf_otel.cli import main as tf_otel_main

# ---------------------------------------------------------------------------- the trace tables


REPO = Path(__file__).resolve().parents[2]
WASM_SHELL = REPO / "scripts" / "trace_processor_wasm.js"
WASM_DIR = Path(sys.prefix) / "share" / "perfetto-wasm"  # scripts/install.sh


def _trace_processor() -> Tuple[str, List[str]]:
    """The shell the ``perfetto`` client starts, and the flags it passes."""
    native = os.environ.get("TRACE_PROCESSOR_SHELL") or shutil.which("trace_processor_shell")
    if native:
        return native, []
    if not (WASM_DIR / "trace_processor.wasm").is_file() or not shutil.which("node"):
        pytest.fail(f"no trace processor: run scripts/install.sh (fills {WASM_DIR}; needs node)")
    return str(WASM_SHELL), ["--wasm-dir", str(WASM_DIR)]


def _tables_from_trace_processor(path: Path) -> Dict[str, Any]:
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    binary, flags = _trace_processor()
    config = TraceProcessorConfig(bin_path=binary, extra_flags=flags, load_timeout=60)
    tp = TraceProcessor(trace=str(path), config=config)
    try:
        processes = {
            r.pid: r.name for r in tp.query("select pid, name from process where name is not null")
        }
        slices = [
            (r.pid, r.name, r.ts, r.dur, r.span_id)
            for r in tp.query(
                "select p.pid as pid, s.name as name, s.ts as ts, s.dur as dur, "
                "extract_arg(s.arg_set_id, 'args.span_id') as span_id from slice s "
                "join thread_track tt on s.track_id = tt.id join thread using (utid) "
                "join process p using (upid)"
            )
        ]
        flows = [
            (r.out_pid, r.in_pid)
            for r in tp.query(
                "select po.pid as out_pid, pi.pid as in_pid from flow f "
                "join slice so on f.slice_out = so.id "
                "join thread_track to2 on so.track_id = to2.id "
                "join thread tho on to2.utid = tho.utid join process po on tho.upid = po.upid "
                "join slice si on f.slice_in = si.id "
                "join thread_track ti on si.track_id = ti.id "
                "join thread thi on ti.utid = thi.utid join process pi on thi.upid = pi.upid"
            )
        ]
        errors = [
            f"{r.name}={r.value}"
            for r in tp.query(
                # what the importer counted as an error or a loss, and flows it could not bind
                # (``info``, like the harmless json_display_time_unit)
                "select name, value from stats where value > 0 and (severity != 'info' "
                "or name like '%flow%' or name like 'slice_%' or name like '%misplaced%')"
            )
        ]
    finally:
        tp.close()
    return {"processes": processes, "slices": slices, "flows": flows, "errors": errors}


def _ns(value: Any) -> int:
    """µs to ns as the trace processor (v52) computes it, measured on it: a number read as a
    double; an integral one times 1000 exactly, else ``llround(x * 1000.0)`` in doubles."""
    if isinstance(value, int) or float(value).is_integer():
        return int(value) * 1000
    scaled = value * 1000.0
    floor = math.floor(scaled)
    return int(floor) + (1 if scaled - floor >= 0.5 else 0)  # half away from zero (ts >= 0)


def import_like_perfetto(document: Dict[str, Any]) -> Dict[str, Any]:
    """Perfetto's JSON import rules, strictly: every problem it would count is an error here."""
    errors: List[str] = []
    processes: Dict[int, str] = {}
    thread_pid: Dict[int, int] = {}
    events = document["traceEvents"]
    for event in events:
        assert event["ph"] in ("X", "M", "s", "f"), event
        for key in ("pid", "ph", "name"):
            assert key in event, event
        if event["ph"] == "M":
            assert event["name"] in (
                "process_name",
                "process_sort_index",
                "thread_name",
                "thread_sort_index",
            ), event
            if event["name"] == "process_name":
                processes[event["pid"]] = event["args"]["name"]
            if "tid" in event:  # Perfetto names threads by tid alone: tids must be unique
                assert thread_pid.setdefault(event["tid"], event["pid"]) == event["pid"]
    slices = []
    stacks: Dict[Tuple[int, int], List[Tuple[int, int, str]]] = defaultdict(list)
    flow_out: Dict[Tuple[int, str], int] = {}
    flows = []
    timed = [e for e in events if e["ph"] != "M"]
    timed.sort(key=lambda e: _ns(e["ts"]))  # the sorter: by ts, stable
    for event in timed:
        assert isinstance(event["tid"], int) and isinstance(event["ts"], (int, float)), event
        assert 0 < event["tid"] < 2**32, event  # else Perfetto files it under the main thread
        assert thread_pid.get(event["tid"], event["pid"]) == event["pid"]
        stack = stacks[(event["pid"], event["tid"])]
        at = _ns(event["ts"])
        if event["ph"] in ("s", "f"):  # binds to the innermost open slice (not popped lazily)
            assert event["ph"] == "s" or event.get("bp") == "e", event
            key = (event["id"], event["cat"])
            if not stack or not stack[-1][0] < at < stack[-1][1]:
                errors.append(f"flow {key} at {at} outside its slice")
            elif event["ph"] == "s":
                flow_out[key] = event["pid"]
            elif key not in flow_out:
                errors.append(f"flow_end_without_start {key}")
            else:
                flows.append((flow_out[key], event["pid"]))
            continue
        assert event["ph"] == "X" and isinstance(event["dur"], (int, float)), event
        assert event["dur"] >= 0, event
        end = at + _ns(event["dur"])
        while stack and stack[-1][1] <= at:
            stack.pop()
        if stack and end > stack[-1][1]:
            errors.append(f"misplaced slice {event['name']} on tid {event['tid']}")
        stack.append((at, end, event["args"]["span_id"]))
        slices.append((event["pid"], event["name"], at, end - at, event["args"]["span_id"]))
    return {"processes": processes, "slices": slices, "flows": flows, "errors": errors}


def trace_tables(path: Path) -> Dict[str, Any]:
    """The export as Perfetto's trace processor loads it; the strict model must read the same."""
    tables = _tables_from_trace_processor(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as handle:
        model = import_like_perfetto(json.load(handle))
    assert model["errors"] == []
    assert model["processes"] == tables["processes"]
    assert sorted(model["slices"]) == sorted(tables["slices"])
    assert sorted(model["flows"]) == sorted(tables["flows"])
    return tables


# ------------------------------------------------------------------------------- the builders


def collective_job(steps=(0, 1, 2, 3), world: int = 3) -> JobBuilder:
    """Each step: rank r computes (two ops overlapping without nesting on rank 0), waits for its
    input, then one allreduce per tensor that the last rank (r = world-1) joins last."""
    job = JobBuilder("job-export", world_size=world)
    for n in steps:
        step = job.step(n)
        base = n * 100.0
        for rank in range(world):
            step.rank(rank, base, base + 50 + 5 * n)
            step.span(rank, "input", "IteratorGetNext", base + 0.5, base + 2.25)
            step.span(rank, "compute", "matmul", base + 3, base + 10.123456)
            if rank == 0:  # overlaps matmul without nesting: a second compute lane
                step.span(rank, "compute", "conv", base + 8, base + 12)
            arrival = base + 12 + 4 * rank
            for tensor in ("grad0", "grad1"):
                offset = 0.0 if tensor == "grad0" else 20.0
                step.collective(
                    rank,
                    f"{n}/{tensor}",
                    arrival + offset,
                    base + 30 + offset,
                    wait_end=base + 24.5 + offset,
                    **{
                        "horovod.tensor": tensor,
                        "horovod.last_arrival": rank == world - 1,
                        "http.request.header.authorization": "Bearer do-not-export",
                    },
                )
    return job


def export(*args: str) -> int:
    return tf_otel_main(["export", *args])


def built_spans(job: JobBuilder) -> Dict[str, Any]:
    return {span.span_id: span for step in job.steps for span in step.all_spans()}


# ------------------------------------------------------------------------------- unit tests


def test_the_trace_processor_flags_what_the_export_must_avoid(tmp_path):
    """The control: slices that overlap without nesting and a flow that ends before it starts
    are reported by the trace processor and by the model alike (the checks below can fail)."""
    document = {
        "traceEvents": [
            {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "rank 0 @ h"}},
            {"ph": "M", "pid": 1, "tid": 10, "name": "thread_name", "args": {"name": "t"}},
            {"ph": "X", "pid": 1, "tid": 10, "ts": 100.0, "dur": 50.0, "name": "a",
             "args": {"span_id": "a"}},
            {"ph": "X", "pid": 1, "tid": 10, "ts": 120.0, "dur": 50.0, "name": "b",
             "args": {"span_id": "b"}},
            {"ph": "s", "pid": 1, "tid": 10, "ts": 300.0, "name": "f", "cat": "c", "id": 1},
            {"ph": "f", "bp": "e", "pid": 1, "tid": 10, "ts": 130.0, "name": "f", "cat": "c",
             "id": 1},
        ]
    }  # fmt: skip
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    tables = _tables_from_trace_processor(path)
    assert {error.split("=")[0] for error in tables["errors"]} == {
        "slice_drop_overlapping_complete_event",
        "flow_end_without_start",
    }
    assert [row[4] for row in tables["slices"]] == ["a"] and tables["flows"] == []
    model = import_like_perfetto(document)
    assert any("misplaced slice b" in e for e in model["errors"])
    assert any("flow_end_without_start" in e or "outside" in e for e in model["errors"])


def test_every_rank_is_a_process_every_span_a_slice_of_its_duration(tmp_path, capsys):
    job = collective_job()
    job.write_otlp(tmp_path / "spans.jsonl")
    out = tmp_path / "trace.json"
    assert export(str(tmp_path / "spans.jsonl"), "-o", str(out)) == 0
    tables = trace_tables(out)
    assert tables["errors"] == []
    ranks = {pid: name for pid, name in tables["processes"].items() if name.startswith("rank ")}
    assert sorted(ranks.values()) == [f"rank {r} @ host{r}" for r in range(3)]
    expected = built_spans(job)
    by_id = {row[4]: row for row in tables["slices"]}
    assert set(by_id) == set(expected)  # every span once, nothing else
    for span_id, span in expected.items():
        pid, name, ts, dur, _ = by_id[span_id]
        assert name == span.name
        assert abs(ts - span.start_ns) <= 1000 and abs(dur - (span.end_ns - span.start_ns)) <= 1
        if span.rank is not None and span.attributes["tf_otel.category"] != "step.root":
            assert tables["processes"][pid] == f"rank {span.rank} @ host{span.rank}"
    # per step and tensor, each waiting rank's wait links to the last rank's allreduce
    assert len(tables["flows"]) == 4 * 2 * 2
    pid_rank = {pid: int(name.split()[1]) for pid, name in ranks.items()}
    for out_pid, in_pid in tables["flows"]:
        assert pid_rank[out_pid] in (0, 1) and pid_rank[in_pid] == 2
    assert "16 collective flows" in capsys.readouterr().err


def test_tracks_per_category_lanes_for_overlaps_args_without_secrets(tmp_path):
    job = collective_job(steps=(0,))
    job.write_otlp(tmp_path / "spans.jsonl")
    out = tmp_path / "trace.json"
    assert export(str(tmp_path), "-o", str(out)) == 0
    document = json.loads(out.read_text())
    threads = {
        (e["pid"], e["args"]["name"])
        for e in document["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    rank0 = {name for pid, name in threads if pid == 1}
    assert rank0 == {
        "step",
        "input",
        "compute (ops)",
        "compute (ops) 2",  # conv overlaps matmul without nesting
        "collectives",
        "collective wait",
        "collective transfer",
    }
    slices = [e for e in document["traceEvents"] if e["ph"] == "X"]
    collectives = [e for e in slices if e["cat"] == "collective"]
    assert collectives
    assert all(e["args"]["horovod.tensor"] in ("grad0", "grad1") for e in collectives)
    assert not any("authorization" in key for e in slices for key in e["args"])
    assert "do-not-export" not in out.read_text()


def _exported_steps(path: Path) -> List[int]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as handle:
        document = json.load(handle)
    return sorted(
        {e["args"]["tf_otel.step"] for e in document["traceEvents"] if e.get("cat") == "step.root"}
    )


def test_step_selection_list_slowest_and_the_default_bound(tmp_path, capsys):
    job = collective_job(steps=range(8))
    job.write_otlp(tmp_path / "spans.jsonl")
    src = str(tmp_path / "spans.jsonl")
    assert export(src, "--steps", "1,3-4,6:6", "-o", str(tmp_path / "a.json")) == 0
    assert _exported_steps(tmp_path / "a.json") == [1, 3, 4, 6]
    assert export(src, "--slowest", "2", "-o", str(tmp_path / "b.json.gz")) == 0
    assert (tmp_path / "b.json.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert _exported_steps(tmp_path / "b.json.gz") == [6, 7]  # step n lasts 50 + 5n ms
    assert trace_tables(tmp_path / "b.json.gz")["errors"] == []
    capsys.readouterr()
    assert export(src, "--max-steps", "3", "-o", str(tmp_path / "c.json")) == 0
    assert _exported_steps(tmp_path / "c.json") == [0, 1, 2]
    assert "8 steps selected; writing the first 3" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, named",
    [
        (["--steps", "3,x"], "'x'"),
        (["--steps", "5-2"], "'5-2'"),
        (["--steps", "3,,4"], "'3,,4'"),
        (["--steps", "40-50"], "'40-50'"),
        (["--slowest", "0"], "--slowest 0"),
        (["--max-steps", "-1"], "--max-steps -1"),
        (["--since", "yesterday"], "'yesterday'"),
    ],
)
def test_bad_values_exit_2_with_one_line_naming_them(tmp_path, capsys, args, named):
    collective_job(steps=(0, 1)).write_otlp(tmp_path / "spans.jsonl")
    out = tmp_path / "trace.json"
    assert export(str(tmp_path / "spans.jsonl"), *args, "-o", str(out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0] and "Traceback" not in err[0], err
    assert not out.exists()


def test_bad_sources_exit_2(tmp_path, capsys):
    assert export(str(tmp_path / "missing"), "-o", str(tmp_path / "t.json")) == 2
    assert "missing" in capsys.readouterr().err
    collective_job(steps=(0,)).write_otlp(tmp_path / "spans.jsonl")
    assert export(str(tmp_path / "spans.jsonl"), "-o", str(tmp_path / "no" / "t.json")) == 2
    assert "--output" in capsys.readouterr().err


def test_a_jaeger_download_exports_the_same_slices(tmp_path):
    job = collective_job(steps=(0, 1))
    (tmp_path / "jaeger.json").write_text(json.dumps({"data": job.jaeger_traces()}))
    out = tmp_path / "trace.json"
    assert export(str(tmp_path / "jaeger.json"), "-o", str(out)) == 0
    tables = trace_tables(out)
    assert tables["errors"] == [] and len(tables["flows"]) == 2 * 2 * 2
    assert {row[4] for row in tables["slices"]} == set(built_spans(job))


# ------------------------------------------------------------------------------ a real run


@pytest.mark.integration
def test_a_real_horovod_run_exports_ranks_slices_and_collective_flows(tmp_path):
    from conftest import base_env, horovodrun

    from tf_otel.analysis.load.files import load_paths

    env = base_env(
        TF_OTEL_ENABLED="1",
        TF_OTEL_FILE=str(tmp_path / "spans" / "spans-{rank}.jsonl"),
        OTEL_SERVICE_NAME="export-real",
        OTEL_TRACES_EXPORTER="none",
        TF_OTEL_HOROVOD_EVERY="1",  # collective detail on every step
        STEPS="4",
    )
    (tmp_path / "spans").mkdir()
    horovodrun("horovod_tape.py", env, backend="gloo")
    out = tmp_path / "trace.json.gz"
    assert export(str(tmp_path / "spans"), "-o", str(out)) == 0
    tables = trace_tables(out)
    assert tables["errors"] == []
    ranks = {pid: name for pid, name in tables["processes"].items() if name.startswith("rank ")}
    assert sorted(name.split(" @ ")[0] for name in ranks.values()) == ["rank 0", "rank 1"]
    spans = {
        s.span_id: s
        for s in load_paths([str(tmp_path / "spans")], workers=1)
        if s.category != "job"
    }
    by_id = {row[4]: row for row in tables["slices"]}
    assert set(by_id) == set(spans)
    per_rank: Dict[int, int] = defaultdict(int)
    for span_id, span in spans.items():
        pid, _, ts, dur, _ = by_id[span_id]
        assert abs(ts - span.start_ns) <= 1000 and abs(dur - span.duration_ns) <= 1
        if span.category != "step.root":
            assert ranks[pid].startswith(f"rank {span.rank} @ ")
            per_rank[span.rank] += 1
    assert set(per_rank) == {0, 1}
    collectives = [s for s in spans.values() if s.category == "collective"]
    assert collectives, "the run recorded no collective spans"
    crossing = [(o, i) for o, i in tables["flows"] if o != i]
    assert crossing, "no flow between ranks"
    assert all(o in ranks and i in ranks for o, i in crossing)
