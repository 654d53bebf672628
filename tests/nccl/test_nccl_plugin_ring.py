"""The real NCCL profiler plugin, compiled here and driven through its exported ncclProfiler_vN
structs with descriptors laid out as NCCL's ext-profiler headers document; the ring it writes
is read back with tf_otel.nccl.ring. Only NCCL itself (and a GPU) is absent."""

from __future__ import annotations

import ctypes as C
import os
import subprocess
import threading

import pytest
from nccl_driver import (  # noqa: E402
    COLL,
    GROUP,
    KERNEL_CH,
    PROXY_OP,
    DescrV1,
    DescrV3,
    DescrV4,
    DescrV5,
    ProfV1,
    ProfV3,
    ProfV4,
    ProfV5,
    StateArgsV4,
    build_plugin,
)

from tf_otel.nccl import ring as ringmod
from tf_otel.record import KERNEL


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return C.CDLL(str(build_plugin(tmp_path_factory.mktemp("plugin"))))


@pytest.fixture
def ring_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_OTEL_NCCL_RING_DIR", str(tmp_path))
    monkeypatch.delenv("TF_OTEL_NCCL_RING_RECORDS", raising=False)
    monkeypatch.delenv("TF_OTEL_NCCL_CHILD_EVENTS", raising=False)
    return tmp_path


def _start(p, ctx, d):
    h = C.c_void_p()
    assert p.startEvent(ctx, C.byref(h), C.byref(d)) == 0
    return h


def _coll_v4(seq, func=b"AllReduce", count=1024, dtype=b"ncclFloat32"):
    d = DescrV4(type=COLL, rank=1)
    d.coll.seqNumber = seq
    d.coll.func, d.coll.count, d.coll.datatype = func, count, dtype
    d.coll.nChannels, d.coll.nWarps, d.coll.algo, d.coll.proto = 2, 16, b"Ring", b"Simple"
    return d


def _init_v4(p, comm_hash=0xABCDEF0123456789, rank=1):
    ctx, mask = C.c_void_p(), C.c_int()
    assert p.init(C.byref(ctx), C.byref(mask), b"comm", comm_hash, 1, 4, rank, None) == 0
    return ctx, mask.value


def test_v4_collective_with_children_gives_one_execution_record(lib, ring_dir):
    p = ProfV4.in_dll(lib, "ncclProfiler_v4")
    assert p.name == b"tf_otel"
    ctx, mask = _init_v4(p)
    assert mask == COLL | PROXY_OP | KERNEL_CH
    path = ringmod.ring_path(directory=str(ring_dir))
    lib.tf_otel_nccl_ring_path.restype = C.c_char_p
    assert lib.tf_otel_nccl_ring_path().decode() == path
    reader = ringmod.RingReader.open(path)

    coll = _start(p, ctx, _coll_v4(seq=7))
    assert coll.value
    assert p.stopEvent(coll) == 0  # enqueued: written once (enqueue timing)
    first, lost = reader.read_new()
    assert lost == 0 and len(first) == 1 and first[0].flags == 0

    prox = DescrV4(type=PROXY_OP, parentObj=coll, rank=1)
    prox.proxyOp.pid = os.getpid()
    hp = _start(p, ctx, prox)
    kch = DescrV4(type=KERNEL_CH, parentObj=coll, rank=1)
    kch.kernelCh.pTimer = 1000
    hk = _start(p, ctx, kch)
    assert hp.value and hk.value
    assert p.recordEventState(hk, 22, C.byref(StateArgsV4(pTimer=5000))) == 0
    assert p.stopEvent(hk) == 0
    assert p.stopEvent(hp) == 0  # last child: written again with the real end

    recs = reader.poll(rank=3, step=5, flush=True)
    assert len(recs) == 1
    r = recs[0]
    assert r.category == KERNEL and r.name == "nccl.AllReduce" and r.step == 5
    a = r.attributes
    assert a["nccl.comm_hash"] == "abcdef0123456789" and a["nccl.seq"] == 7
    assert a["nccl.dtype"] == "f32" and a["nccl.algorithm"] == "RING"
    assert a["nccl.protocol"] == "SIMPLE" and a["nccl.bytes"] == 4096
    assert a["nccl.timing"] == "execution" and a["nccl.rank"] == 1 and a["nccl.nranks"] == 4
    assert a["tf_otel.rank"] == 3 and a["nccl.profiler_version"] == 4
    assert r.end_ns > first[0].enqueued_ns >= r.start_ns
    assert reader.read_new() == ([], 0)
    assert p.finalize(ctx) == 0
    hdr = reader.header()
    assert hdr["write_index"] == 2 and hdr["dropped"] == 0 and hdr["pid"] == os.getpid()
    reader.close(unlink=True)
    assert not os.path.exists(path)


def test_v4_gpu_timers_and_group_events_ignored(lib, ring_dir):
    p = ProfV4.in_dll(lib, "ncclProfiler_v4")
    ctx, _ = _init_v4(p)
    g = _start(p, ctx, DescrV4(type=GROUP))
    assert not g.value  # groups: no handle, nothing recorded
    assert p.stopEvent(g) == 0
    coll = _start(p, ctx, _coll_v4(seq=1))
    for t0, t1 in ((300, 900), (200, 700)):
        kch = DescrV4(type=KERNEL_CH, parentObj=coll)
        kch.kernelCh.pTimer = t0
        h = _start(p, ctx, kch)
        p.recordEventState(h, 22, C.byref(StateArgsV4(pTimer=t1)))
        p.stopEvent(h)
    p.stopEvent(coll)
    reader = ringmod.RingReader.open(ringmod.ring_path(directory=str(ring_dir)))
    evs, _ = reader.read_new()
    last = evs[-1]
    assert (last.gpu_start, last.gpu_end, last.nchildren) == (200, 900, 2)
    p.finalize(ctx)
    reader.close(unlink=True)


def test_child_events_off_and_foreign_proxy_ignored(lib, ring_dir, monkeypatch):
    monkeypatch.setenv("TF_OTEL_NCCL_CHILD_EVENTS", "0")
    p = ProfV4.in_dll(lib, "ncclProfiler_v4")
    ctx, mask = _init_v4(p)
    assert mask == COLL
    coll = _start(p, ctx, _coll_v4(seq=2))
    prox = DescrV4(type=PROXY_OP, parentObj=coll)
    prox.proxyOp.pid = os.getpid() + 100000  # PXN: another process's parent pointer
    assert not _start(p, ctx, prox).value
    bogus = DescrV4(type=PROXY_OP, parentObj=12345)  # not one of ours: never dereferenced
    bogus.proxyOp.pid = os.getpid()
    assert not _start(p, ctx, bogus).value
    p.stopEvent(coll)
    reader = ringmod.RingReader.open(ringmod.ring_path(directory=str(ring_dir)))
    (rec,) = reader.poll(flush=True)
    assert rec.attributes["nccl.timing"] == "enqueue"
    p.finalize(ctx)
    reader.close(unlink=True)


def test_v1_enum_codes_and_v3_comm_hash(lib, ring_dir):
    p1 = ProfV1.in_dll(lib, "ncclProfiler_v1")
    ctx, mask = C.c_void_p(), C.c_int()
    assert p1.init(C.byref(ctx), C.byref(mask)) == 0
    assert mask.value == COLL | PROXY_OP  # no KernelCh before v3
    d = DescrV1(type=COLL, rank=0)
    d.coll.commHash, d.coll.seqNumber = 0x11, 3
    d.coll.func, d.coll.datatype, d.coll.op = 3, 9, 0  # ReduceScatter, bf16, Sum
    d.coll.algo, d.coll.proto, d.coll.count, d.coll.trafficBytes = 1, 1, 10, 777
    p1.stopEvent(_start(p1, ctx, d))

    p3 = ProfV3.in_dll(lib, "ncclProfiler_v3")
    ctx3 = C.c_void_p()
    assert p3.init(C.byref(ctx3), C.byref(mask)) == 0
    assert mask.value == COLL | PROXY_OP | KERNEL_CH
    d3 = DescrV3(type=COLL, rank=2)
    d3.coll.commHash, d3.coll.seqNumber, d3.coll.func = 0x22, 4, b"Broadcast"
    d3.coll.datatype, d3.coll.count, d3.coll.algo, d3.coll.proto = b"ncclInt8", 5, b"Ring", b"LL"
    p3.stopEvent(_start(p3, ctx3, d3))

    reader = ringmod.RingReader.open(ringmod.ring_path(directory=str(ring_dir)))
    recs = sorted(reader.poll(flush=True), key=lambda r: r.attributes["nccl.seq"])
    a1, a3 = recs[0].attributes, recs[1].attributes
    assert (a1["nccl.collective"], a1["nccl.dtype"], a1["nccl.op"]) == (
        "ReduceScatter",
        "bf16",
        "Sum",
    )
    assert (a1["nccl.algorithm"], a1["nccl.protocol"], a1["nccl.bytes"]) == ("RING", "LL128", 777)
    assert a1["nccl.comm_hash"] == "0000000000000011" and a1["nccl.profiler_version"] == 1
    assert (a3["nccl.collective"], a3["nccl.comm_hash"], a3["nccl.bytes"]) == (
        "Broadcast",
        "0000000000000022",
        5,
    )
    p1.finalize(ctx)
    p3.finalize(ctx3)
    reader.close(unlink=True)


def test_v5_comm_id_from_init_and_api_events_skipped(lib, ring_dir):
    p = ProfV5.in_dll(lib, "ncclProfiler_v5")
    ctx, mask = C.c_void_p(), C.c_int()
    assert p.init(C.byref(ctx), 0x5555, C.byref(mask), b"c", 1, 2, 0, None) == 0
    api = DescrV5(type=1 << 9)
    api.collApi.func = b"AllReduce"
    ha = _start(p, ctx, api)
    assert not ha.value
    d = DescrV5(type=COLL, parentObj=ha)
    d.coll.seqNumber, d.coll.func, d.coll.datatype, d.coll.count = (
        9,
        b"AllGather",
        b"ncclFloat16",
        8,
    )
    d.coll.algo, d.coll.proto = b"NVLS", b"Simple"
    p.stopEvent(_start(p, ctx, d))
    reader = ringmod.RingReader.open(ringmod.ring_path(directory=str(ring_dir)))
    (r,) = reader.poll(flush=True)
    a = r.attributes
    assert (a["nccl.comm_hash"], a["nccl.seq"], a["nccl.collective"]) == (
        "0000000000005555",
        9,
        "AllGather",
    )
    assert (a["nccl.bytes"], a["nccl.algorithm"], a["nccl.profiler_version"]) == (16, "NVLS", 5)
    p.finalize(ctx)
    reader.close(unlink=True)


def test_ring_overwrites_oldest_and_counts_lost(lib, ring_dir, monkeypatch):
    monkeypatch.setenv("TF_OTEL_NCCL_RING_RECORDS", "64")
    p = ProfV4.in_dll(lib, "ncclProfiler_v4")
    ctx, _ = _init_v4(p)
    path = ringmod.ring_path(directory=str(ring_dir))
    assert os.path.getsize(path) == 128 + 64 * 192
    reader = ringmod.RingReader.open(path)
    for seq in range(100):
        p.stopEvent(_start(p, ctx, _coll_v4(seq=seq)))
    evs, lost = reader.read_new()
    assert lost == 36 and reader.lost == 36
    assert [e.seq for e in evs] == list(range(36, 100))
    p.finalize(ctx)
    reader.close(unlink=True)


def test_coll_pool_full_drops_and_counts(lib, ring_dir):
    p = ProfV4.in_dll(lib, "ncclProfiler_v4")
    ctx, _ = _init_v4(p)
    handles = [_start(p, ctx, _coll_v4(seq=i)) for i in range(1024)]  # none enqueued yet
    assert all(h.value for h in handles)
    assert not _start(p, ctx, _coll_v4(seq=2000)).value
    reader = ringmod.RingReader.open(ringmod.ring_path(directory=str(ring_dir)))
    assert reader.header()["dropped"] == 1
    assert p.finalize(ctx) == 0  # flushes the 1024 in-flight collectives
    evs, _ = reader.read_new()
    assert len(evs) == 1024 and all(e.flags & ringmod.FLAG_FLUSHED for e in evs)
    reader.close(unlink=True)


def test_concurrent_writers_produce_complete_records(lib, ring_dir):
    p = ProfV4.in_dll(lib, "ncclProfiler_v4")
    ctxs = [_init_v4(p, comm_hash=100 + t)[0] for t in range(4)]

    def work(t):
        for seq in range(500):
            p.stopEvent(_start(p, ctxs[t], _coll_v4(seq=seq)))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    reader = ringmod.RingReader.open(ringmod.ring_path(directory=str(ring_dir)))
    recs = reader.poll(flush=True)
    keys = {(r.attributes["nccl.comm_hash"], r.attributes["nccl.seq"]) for r in recs}
    assert len(recs) == 2000 and len(keys) == 2000
    for c in ctxs:
        p.finalize(c)
    reader.close(unlink=True)


def test_bad_ring_files_give_one_clear_error(tmp_path):
    junk = tmp_path / "tf_otel_nccl_1"
    junk.write_bytes(b"x" * 400)
    with pytest.raises(ringmod.RingError, match="bad magic"):
        ringmod.RingReader.open(str(junk))
    (tmp_path / "small").write_bytes(b"TFOTNCL1")
    with pytest.raises(ringmod.RingError, match="too small"):
        ringmod.RingReader.open(str(tmp_path / "small"))
    with pytest.raises(ringmod.RingError, match="cannot open"):
        ringmod.RingReader.open(str(tmp_path / "missing"))


def test_settle_time_holds_back_fresh_collectives(lib, ring_dir):
    p = ProfV4.in_dll(lib, "ncclProfiler_v4")
    ctx, _ = _init_v4(p)
    reader = ringmod.RingReader.open(ringmod.ring_path(directory=str(ring_dir)))
    p.stopEvent(_start(p, ctx, _coll_v4(seq=1)))
    (ev,) = reader.read_new()[0]
    reader._next = 0  # re-read through poll
    assert reader.poll(settle_ns=10**9, now_ns=ev.end_ns + 1) == []
    assert len(reader.poll(settle_ns=10**9, now_ns=ev.end_ns + 10**9)) == 1
    p.finalize(ctx)
    reader.close(unlink=True)


def test_cleanup_stale_removes_dead_pids_only(tmp_path):
    proc = subprocess.Popen(["true"])
    proc.wait()
    (tmp_path / f"tf_otel_nccl_{proc.pid}").write_bytes(b"")
    (tmp_path / f"tf_otel_nccl_{os.getpid()}").write_bytes(b"")
    (tmp_path / "unrelated").write_bytes(b"")
    assert ringmod.cleanup_stale(str(tmp_path)) == 1
    assert sorted(os.listdir(tmp_path)) == sorted([f"tf_otel_nccl_{os.getpid()}", "unrelated"])
