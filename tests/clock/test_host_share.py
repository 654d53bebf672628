"""One clock sync per host (clock/host_share.py): real ClockSync objects over real TCP, four
ranks on two named hosts. Rank 0 leads its host with the identity; on the other host one rank
connects and runs rounds, the other takes its model without connecting; when the leader stops,
the follower takes over; a model left by an earlier process is never taken. Control: without
sharing every rank connects. The share's files (``clock-*`` in /tmp/tf_otel-<uid>): a job
leaves none; a process sweeps a dead job's, never a live or recent one's."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, List

from conftest import free_port_pair
from locks import held_elsewhere

from tf_otel import clock
from tf_otel.clock import sync as sync_module
from tf_otel.clock.host_share import HostShare, private_dir
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
    topology = Topology(
        rank=rank,
        world_size=4,
        local_rank=rank % 2,
        local_size=2,
        host=HOSTS[rank],
        job_id=job_id,
    )
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


def test_a_rank_that_starts_before_rank_0_on_its_host_leaves_it_the_lead() -> None:
    """Rank 1 (local rank 1) starts 0.5 s before rank 0 on hostA: it follows rank 0's exact
    identity and never runs rounds of its own (it led, and ran unsettled rounds against a rank
    0 still starting, when it won the host's lock first: a CI run lost its arrival stamps)."""
    job_id, port = f"first-{uuid.uuid4().hex[:8]}", free_port_pair()
    early = _start(1, job_id, port, share=True)
    syncs = [early]
    try:
        time.sleep(0.5)
        rank0 = _start(0, job_id, port, share=True)
        syncs.insert(0, rank0)
        assert _until(lambda: early.stats.rounds >= SETTLED_ROUNDS, 5)
        assert early.share is not None and not early.share.leading
        assert early.model == clock.IDENTITY and not early._client.connected
        assert _connections(rank0) == 0
    finally:
        for sync in reversed(syncs):
            sync.stop(1.0)


def test_a_host_whose_first_rank_never_comes_is_led_by_another_after_the_grace(
    monkeypatch: Any,
) -> None:
    """Control: the grace only defers. Rank 3 (local rank 1 on hostB) alone there leads after
    it and runs its own rounds against rank 0."""
    monkeypatch.setattr(sync_module, "LEAD_GRACE_S", 0.3)
    job_id, port = f"grace-{uuid.uuid4().hex[:8]}", free_port_pair()
    syncs = [_start(0, job_id, port, share=True), _start(3, job_id, port, share=True)]
    try:
        late = syncs[1]
        assert _until(lambda: late.stats.rounds >= SETTLED_ROUNDS, 10)
        assert late.share is not None and late.share.leading and late._client.connected
        assert late.model.uncertainty_ns > 0
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
    assert stale._lock_fd is not None
    os.close(stale._lock_fd)  # its process killed: the kernel drops the lock, the files stay
    sync = _start(2, job_id, free_port_pair(), share=True)  # no rank 0 listening
    try:
        assert _until(lambda: sync.share is not None and sync.share.leading, 5)
        time.sleep(0.3)
        assert sync.model == clock.IDENTITY and sync.stats.rounds == 0
    finally:
        sync.stop(0.5)


# -- the share's files in the private directory (/tmp/tf_otel-<uid>) ----------------------------

HOUR_S = 3600.0  # files untouched this long, their lock not held, are a dead job's


def _private_dir(tmp_path: Path, monkeypatch: Any) -> Path:
    """The private directory under a temp dir of this test's own (nothing else sweeps it)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    directory = private_dir()
    assert directory is not None and directory.parent == tmp_path
    return directory


def _clock_files(directory: Path) -> List[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("clock-"))


def test_a_job_whose_leaders_and_followers_leave_leaves_no_clock_files(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Before, each job left its hosts' lock and model files behind (rank 0's for hostA, the
    leader's for hostB; hundreds in a user's /tmp/tf_otel-<uid> after a while). Now a leader
    removes its own as it leaves; a follower that takes over makes new ones, removed as it
    leaves too."""
    directory = _private_dir(tmp_path, monkeypatch)
    syncs = _job(share=True)
    try:
        other_host = syncs[2:]
        assert _until(lambda: all(s.stats.rounds >= SETTLED_ROUNDS for s in syncs[1:]), 15)
        assert _until(lambda: len(_clock_files(directory)) == 4, 5)  # a lock, a model a host
        leader = next(s for s in other_host if s.share is not None and s.share.leading)
        follower = next(s for s in other_host if s is not leader)
        leader.stop(2.0)
        assert _until(lambda: follower.share is not None and follower.share.leading, 10)
        assert follower.resync_now(wait_s=5.0)
        assert _until(lambda: len(_clock_files(directory)) == 4, 5)  # the new leader's
    finally:
        for sync in reversed(syncs):
            sync.stop(1.0)
    assert _clock_files(directory) == []


def test_a_share_released_is_neither_led_nor_written_again(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """ClockSync.stop releases the share while its thread may still run a last round (past the
    join's timeout): that round's publish and claim leave no files behind."""
    directory = _private_dir(tmp_path, monkeypatch)
    share = HostShare.for_job(f"released-{uuid.uuid4().hex[:8]}", "hostB")
    assert share is not None and share.claim()
    share.publish(clock.IDENTITY, 1)
    assert len(_clock_files(directory)) == 2
    share.release()
    share.publish(clock.IDENTITY, 2)
    assert not share.claim() and not share.leading
    assert _clock_files(directory) == []


def _first_share_of_a_process(tmp_path: Path) -> None:
    """A new process (its temp dir ``tmp_path``) takes part in a host share."""
    code = "from tf_otel.clock.host_share import HostShare; HostShare.for_job('new-job', 'hostA')"
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(Path(__file__).parents[2]))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=30)


def test_a_process_sweeps_stale_clock_files_but_never_a_live_or_recent_shares(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """At a process's first share: a dead job's files (their lock not held, untouched for an
    hour) are removed; a live rank's (its lock held by another process, files as old) and a
    recent share's (a leader that left a minute ago) are not, nor files that are not a clock
    share's (the relay's election's, swept by its own elections)."""
    directory = _private_dir(tmp_path, monkeypatch)
    old = time.time() - 2 * HOUR_S

    def files(name: str, mtime: float) -> List[Path]:
        made = [
            directory / f"clock-{name}.lock",
            directory / f"clock-{name}.json",
            directory / f"clock-{name}.12345.tmp",  # a publish cut short
        ]
        for path in made:
            path.write_text("x")
            os.utime(path, (mtime, mtime))
        return made

    dead = files("a" * 24, old)
    live = files("b" * 24, old)
    recent = files("c" * 24, time.time() - 60)
    others = [
        directory / f"relay-{'d' * 24}.lock",
        directory / f"relay-{'d' * 24}.json",
        directory / "clock-notashare.lock",
    ]
    for path in others:
        path.write_text("x")
        os.utime(path, (old, old))
    with held_elsewhere(live[0]):  # a live rank of another process holds the lock
        _first_share_of_a_process(tmp_path)
        assert not any(path.exists() for path in dead)
        assert all(path.exists() for path in live + recent + others)
    # once its holder is gone the live job's files are stale too (a later process's sweep)
    _first_share_of_a_process(tmp_path)
    assert not any(path.exists() for path in live)
    assert all(path.exists() for path in recent + others)
