"""Every cross-rank buffer is bounded and counts what it drops: a step window's collectives
(the per-rank records rank 0 sends with ``hvd.c``), messages held for a rank not yet connected,
records queued for export, the clock service's connection list."""

from __future__ import annotations

import socket

from opentelemetry.sdk.trace import TracerProvider

from tf_otel import record
from tf_otel.clock import transport
from tf_otel.cluster import coordinator
from tf_otel.config import Settings
from tf_otel.health import counters
from tf_otel.instrument.horovod import timeline
from tf_otel.job.topology import Topology
from tf_otel.runtime.steps import Pipeline
from tf_otel.sources import horovod_timeline as tl

from .channel_peers import wait_until


def test_a_step_window_that_never_ends_keeps_at_most_the_cap(monkeypatch) -> None:
    monkeypatch.setattr(timeline, "MAX_COLLECTIVES_PER_STEP", 50)
    hook = timeline.TimelineHook()
    hook._windows[("k", 0)] = timeline._Window(start=0)
    dropped = counters["horovod_collectives_dropped"]
    hook._attach([tl.Collective(f"t{i}", op_start=1.0 + i, op_end=2.0 + i) for i in range(80)], 0)
    assert len(hook._windows[("k", 0)].items) == 50
    assert counters["horovod_collectives_dropped"] - dropped == 30


def test_messages_held_for_an_unconnected_rank_are_bounded_in_bytes() -> None:
    aggregator = coordinator.StepAggregator(2, 1.0, lambda *args: None)
    try:
        dropped = counters["coordinator_held_dropped"]
        big = {"t": "x", "p": "a" * (1 << 20)}  # 1 MiB each
        sent = [aggregator.send(1, big) for _ in range(40)]
        assert sent.count(True) == coordinator.MAX_HELD_BYTES // (1 << 20) - 1
        assert counters["coordinator_held_dropped"] - dropped == sent.count(False)
        assert sum(len(m) for m in aggregator._held[1]) <= coordinator.MAX_HELD_BYTES
    finally:
        aggregator.close()


def test_records_queued_for_export_are_bounded() -> None:
    pipeline = Pipeline(Settings(max_queue=16), Topology(job_id="bounds"), TracerProvider())
    dropped = counters["records_dropped"]
    rec = record.Record(name="r", category="collective", start_ns=1, end_ns=2)
    for step in range(40):  # the export thread is not started: nothing drains the queue
        pipeline.add_records("k", step, [rec, rec])
    assert pipeline._queue.qsize() == 16
    assert counters["records_dropped"] - dropped == 2 * (40 - 16)


def test_the_clock_service_keeps_only_live_connections() -> None:
    server = transport.TcpServer("127.0.0.1", 0)
    server.start()
    try:
        for _ in range(30):
            socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
        assert wait_until(lambda: len(server._conns) == 0)
        assert wait_until(lambda: server._handshaking == 0)
    finally:
        server.close()
