"""One clock sync per host (clock/host_share.py): real ClockSync objects over real TCP, four
ranks on two named hosts. Rank 0 leads its host with the identity; on the other host one rank
connects and runs rounds, the other takes its model without connecting; when the leader stops,
the follower takes over; a model left by an earlier process is never taken. Control: without
sharing every rank connects."""

from __future__ import annotations

import time
import uuid
from typing import Callable, List

from conftest import free_port_pair

from tf_otel import clock
from tf_otel.clock.host_share import HostShare
from tf_otel.clock.sync import SETTLED_ROUNDS, ClockSync
from tf_otel.config import Settings
from tf_otel.job.topology import Topology

HOSTS = {0: "hostA", 1: "hostA", 2: "hostB", 3: "hostB"}


def _until(done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)
    return done()


def _start(rank: int, job_id: str, port: int, share: bool) -> ClockSync:
    topology = Topology(rank=rank, world_size=4, local_size=2, host=HOSTS[rank], job_id=job_id)
    sync = ClockSync(publish=False, share_host=share, warmup_first_s=0.01)
    assert sync.start(topology, Settings(coordinator=("127.0.0.1", port)))
    return sync


def _job(share: bool) -> List[ClockSync]:
    job_id, port = f"share-{uuid.uuid4().hex[:8]}", free_port_pair()
    return [_start(rank, job_id, port, share) for rank in range(4)]


def _connections(rank0: ClockSync) -> int:
    return len(rank0.server._conns)


def test_one_rank_a_host_syncs_the_others_take_its_model() -> None:
    syncs = _job(share=True)
    try:
        rank0, same_host, *other_host = syncs
        assert _until(lambda: all(s.stats.rounds >= SETTLED_ROUNDS for s in syncs[1:]), 15)
        leaders = [s for s in other_host if s.share is not None and s.share.leading]
        assert len(leaders) == 1, "one leader on hostB"
        follower = next(s for s in other_host if s is not leaders[0])
        # rank 0's host: the identity, exact, without a connection
        assert same_host.model == clock.IDENTITY and not same_host._client.connected
        # hostB: the follower holds the leader's model (read after the leader's last round)
        assert _until(lambda: follower.model == leaders[0].model, 10)
        assert leaders[0].model.uncertainty_ns > 0 and not follower._client.connected
        assert _connections(rank0) == 1, "only hostB's leader reaches rank 0's clock service"
        # the leader stops: the follower takes over and runs rounds of its own
        leaders[0].stop(2.0)
        assert _until(lambda: follower.share is not None and follower.share.leading, 10)
        before = follower.stats.rounds
        follower.resync_now(wait_s=5.0)
        assert follower.stats.rounds > before and follower._client.connected
    finally:
        for sync in reversed(syncs):
            sync.stop(1.0)


def test_without_sharing_every_rank_connects() -> None:
    syncs = _job(share=False)
    try:
        assert _until(lambda: all(s.stats.rounds >= 2 for s in syncs[1:]), 15)
        assert _until(lambda: _connections(syncs[0]) == 3, 5), _connections(syncs[0])
    finally:
        for sync in reversed(syncs):
            sync.stop(1.0)


def test_a_model_left_by_an_earlier_process_is_never_taken() -> None:
    job_id = f"stale-{uuid.uuid4().hex[:8]}"
    stale = HostShare.for_job(job_id, "hostB")
    assert stale is not None and stale.claim()
    stale.publish(clock.ClockModel(offset_ns=123_456_789, uncertainty_ns=1), 99)
    stale.release()  # its process is gone: the lock is free, the files stay
    sync = _start(2, job_id, free_port_pair(), share=True)  # no rank 0 listening
    try:
        assert _until(lambda: sync.share is not None and sync.share.leading, 5)
        time.sleep(0.3)
        assert sync.model == clock.IDENTITY and sync.stats.rounds == 0
    finally:
        sync.stop(0.5)
