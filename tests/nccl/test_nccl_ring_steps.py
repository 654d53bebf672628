"""NCCL collectives from the real profiler plugin become kernel spans under the step that
launched them, on every rank, joinable across ranks by nccl.comm_hash + nccl.seq
(horovodrun -np 2; NCCL's calls into the plugin are made by tests/nccl/ring_job.py)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from conftest import base_env, horovodrun
from nccl_driver import build_plugin

from tf_otel.instrument.nccl_ring import plugin_requested

HERE = Path(__file__).resolve().parent


def test_ring_collectives_are_spans_under_their_step_on_every_rank(receiver, tmp_path):
    ring_dir = tmp_path / "shm"
    ring_dir.mkdir()
    env = base_env(
        **receiver.env("grpc"),
        TF_OTEL_ENABLED="1",
        NCCL_PROFILER_PLUGIN=str(build_plugin(tmp_path)),
        TF_OTEL_NCCL_RING_DIR=str(ring_dir),
        STEPS="5",
    )
    result = horovodrun(str(HERE / "ring_job.py"), env)
    assert "rank 0 done" in result.stdout and "rank 1 done" in result.stdout
    spans = receiver.wait_for(lambda s: sum(x.name == "nccl.AllReduce" for x in s) >= 20)
    steps = {s.span_id: s for s in spans if s.category == "step"}
    nccl = [s for s in spans if s.name == "nccl.AllReduce"]
    assert len(nccl) == 20, [s.attributes for s in nccl]
    by_step = defaultdict(list)
    for span in nccl:
        parent = steps[span.parent_id]  # under a step span ...
        assert parent.rank == span.rank and parent.trace_id == span.trace_id  # ... of its rank
        assert span.category == "kernel" and parent.start_ns <= span.start_ns <= parent.end_ns
        a = span.attributes
        assert a["nccl.comm_hash"] == "5eed0123456789ab" and a["nccl.rank"] == span.rank
        assert a["nccl.timing"] == "execution" and a["nccl.bytes"] == 4096 * 4
        assert a["tf_otel.step"] == parent.attributes["tf_otel.step"]
        by_step[(a["tf_otel.step"], span.rank)].append(a["nccl.seq"])
    for step in range(5):  # each rank: the two collectives its step launched, in order
        for rank in (0, 1):
            assert sorted(by_step[(step, rank)]) == [2 * step, 2 * step + 1]
    keys = defaultdict(set)  # one collective = one (comm_hash, seq), seen by both ranks
    for span in nccl:
        keys[(span.attributes["nccl.comm_hash"], span.attributes["nccl.seq"])].add(span.rank)
    assert len(keys) == 10 and all(ranks == {0, 1} for ranks in keys.values())
    assert not list(ring_dir.iterdir()), "rings unlinked once read"


def test_plugin_request_points_nccl_at_the_built_plugin(tmp_path, monkeypatch):
    from tf_otel.instrument import nccl_ring

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no plugin there yet
    built = tmp_path / "libnccl-profiler-tf_otel.so"
    built.write_bytes(b"")
    monkeypatch.setattr(nccl_ring, "PLUGIN_PATH", built)
    env = {"TF_OTEL_NCCL_PROFILER": "1"}
    assert plugin_requested(env) and env["NCCL_PROFILER_PLUGIN"] == str(built)
    own = {"TF_OTEL_NCCL_PROFILER": "1", "NCCL_PROFILER_PLUGIN": "/opt/other.so"}
    assert plugin_requested(own) and own["NCCL_PROFILER_PLUGIN"] == "/opt/other.so"
    assert not plugin_requested({})  # no plugin: the hook stays off
    monkeypatch.setattr(nccl_ring, "PLUGIN_PATH", tmp_path / "missing.so")
    missing = {"TF_OTEL_NCCL_PROFILER": "1"}
    assert not plugin_requested(missing) and "NCCL_PROFILER_PLUGIN" not in missing


def test_the_cli_builds_the_plugin_from_the_packaged_sources_where_it_is_then_found(
    tmp_path, monkeypatch
):
    """`tf-otel nccl-plugin` (a pip install has no scripts/): the package's build of its own
    sources, into the user's cache where the package folder is not writable; the hook finds it
    there. The library exports every profiler version NCCL looks for."""
    import ctypes

    from tf_otel.cli import main
    from tf_otel.instrument import nccl_ring
    from tf_otel.nccl import nccl_plugin_cli

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(nccl_ring, "PLUGIN_PATH", tmp_path / "not-built-here.so")
    # site-packages, read-only
    monkeypatch.setattr(nccl_plugin_cli.os, "access", lambda path, mode: False)
    assert main(["nccl-plugin"]) == 0
    cached = tmp_path / "cache" / "tf_otel" / "libnccl-profiler-tf_otel.so"
    library = ctypes.CDLL(str(cached))
    for version in range(1, 6):
        assert hasattr(library, f"ncclProfiler_v{version}"), version
    env = {"TF_OTEL_NCCL_PROFILER": "1"}
    assert plugin_requested(env) and env["NCCL_PROFILER_PLUGIN"] == str(cached)
    # a folder given as --out: one message naming it, nothing built
    assert main(["nccl-plugin", "--out", str(tmp_path)]) == 2
