"""Background clock synchronisation against rank 0: rounds at start-up, periodically, at stop.

Rank 0 serves (TCP on the coordinator port + 1, or MPI point-to-point when the process already
runs MPI with MPI_THREAD_MULTIPLE); every other rank runs rounds of back-to-back ping-pongs on its
own daemon thread, never on the training thread, and publishes the fitted offset + drift model
with ``tf_otel.clock.set_model``. Rounds come quickly at first (0.01, 0.02, 0.04 ... s apart, so the
drift is known within seconds) and then every ``Settings.clock_interval_s``. An unreachable rank 0
is retried with backoff in the background, logged once; the identity model stays in force.

With ``share_host`` one rank of each host leads and runs the rounds; the others read its model
(clock/host_share.py), since they share the clock: 1,000 ranks on 128 hosts run 127 ranks'
rounds against rank 0, not 1,023. Leaders' first rounds are spread over ``start_spread_s`` and a
failed round is retried after a jittered back-off (50 ms doubling, capped at 5 s until rank 0
first answers, then at the sync interval), because at 4,096 simulated ranks leaders starting
together took ~50 s to connect and retries every few seconds had rank 0 answering ~6x the
planned pings (docs/benchmarks/rank0.md). A round is thrown away only when rank 0 has stopped
answering: each pong has the exchange timeout of its own.

Usage::

    sync = start_sync(topology, settings)   # on every rank; None for a world of one
    sync.resync_now()                        # ask for a round now (returns at once)
    sync.stop()                              # final round with a short timeout, then stop
"""

from __future__ import annotations

import atexit
import collections
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Optional, Tuple

from tf_otel import clock
from tf_otel.clock import estimate
from tf_otel.clock.estimate import Fit, RoundStats, Sample
from tf_otel.clock.host_share import HostShare
from tf_otel.clock.transport import (
    MpiClient,
    MpiServer,
    TcpClient,
    TcpServer,
    mpi_ready,
)
from tf_otel.config import Settings
from tf_otel.health import count, fail_open, log_once, logger
from tf_otel.job.topology import Topology

CLOCK_PORT_DELTA = 1  # the clock service listens on the coordinator port + 1
QUIET_START_S = 3.0  # connection failures this soon after start-up are not logged
# a rank's exports wait for this many warm-up rounds (at 10, 20, 40 ... ms: a drift baseline of
# ~0.3 s), at most SETTLE_MAX_S after start; rank 0's first roots wait as long for its ranks
SETTLED_ROUNDS = 6
SETTLE_MAX_S = 15.0
FOLLOW_EARLY_S = 0.2  # a host follower reads the leader's model this often until settled ...
FOLLOW_S = 5.0  # ... then this often (the leader's rounds are a clock interval apart)
# a rank not first on its host (local rank > 0) leaves the lead to the first this long: on rank
# 0's host rank 0 leads with the exact identity, and a rank that beat it to the lock would run
# rounds against it instead (unsettled for seconds while rank 0 is still starting)
LEAD_GRACE_S = 5.0
# a leader's first round waits uniform(0, spread): spread = this much a client of rank 0's
# clock service (its host leaders, or every rank without host sharing), at most the cap (well
# inside SETTLE_MAX_S, which the warm-up rounds after it must also fit)
START_SPREAD_PER_CLIENT_S = 0.01
START_SPREAD_MAX_S = 5.0
BACKOFF_FIRST_S = 0.05  # a failed round's first retry waits this (x uniform(0.5, 1)) ...
BACKOFF_MAX_S = 5.0  # ... doubling up to this until rank 0 answered a round, then the interval


def start_spread_s(world_size: int, local_size: int, share_host: bool) -> float:
    """The window over which the job's clock clients start their first rounds: rank 0 serves
    one client a host with host sharing (several ranks a host), else one a rank."""
    per_host = max(1, local_size) if share_host else 1
    clients = max(0, -(-world_size // per_host) - 1)  # every host (or rank) but rank 0's
    return min(START_SPREAD_MAX_S, clients * START_SPREAD_PER_CLIENT_S)


@dataclass
class SyncStats:
    rounds: int = 0
    failed_rounds: int = 0
    last_round: Optional[RoundStats] = None
    last_round_s: float = 0.0  # wall time of the last round
    bytes_sent: int = 0
    bytes_received: int = 0


def clock_address(topology: Topology, settings: Settings) -> Optional[Tuple[str, int]]:
    """Where rank 0's clock service listens: (host to connect to, port)."""
    base = settings.coordinator or topology.coordinator_address()
    if base is None:
        return None
    host = base[0]
    if topology.world_size == topology.local_size and settings.coordinator is None:
        host = "127.0.0.1"
    return host, base[1] + CLOCK_PORT_DELTA


def bind_host(topology: Topology, connect_host: str) -> str:
    """127.0.0.1 unless the ranks span several hosts (then every interface)."""
    multi_host = topology.world_size > topology.local_size
    if connect_host in ("127.0.0.1", "localhost") or not multi_host:
        return "127.0.0.1"
    return "0.0.0.0"


class ClockSync:
    """One rank's synchronisation: the server on rank 0, the measuring thread elsewhere."""

    def __init__(
        self,
        exchanges: int = 64,
        window_rounds: int = 12,
        warmup_first_s: float = 0.01,
        connect_timeout_s: float = 2.0,
        exchange_timeout_s: float = 1.0,
        final_timeout_s: float = 0.5,
        transport: str = "auto",
        publish: bool = True,
        share_host: bool = False,
    ) -> None:
        self.exchanges = exchanges
        self.window_rounds = window_rounds
        self.warmup_first_s = warmup_first_s
        self.connect_timeout_s = connect_timeout_s
        self.exchange_timeout_s = exchange_timeout_s
        self.final_timeout_s = final_timeout_s
        self.transport = transport  # auto | tcp | mpi
        self.publish = publish
        self.share_host = share_host  # one leader per host runs the rounds (host_share.py)
        self.share: Optional[HostShare] = None
        self.stats = SyncStats()
        self.fit: Optional[Fit] = None
        self.model: clock.ClockModel = clock.IDENTITY
        self.rank = 0
        self.server: Any = None
        self.address: Optional[Tuple[str, int]] = None
        self.transport_used = ""
        self._client: Any = None
        self._window: Deque[List[Sample]] = collections.deque()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._round_done = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._interval_s = 60.0
        self._start_spread_s = 0.0  # set by start(): see start_spread_s
        self._first_failure: Optional[float] = None
        self._lead_after = 0.0  # monotonic time before which this rank does not claim the lead

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, topology: Topology, settings: Settings) -> bool:
        """Serve (rank 0) or start measuring (other ranks); False when there is nothing to do."""
        if topology.world_size <= 1:
            return False
        self.rank = topology.rank
        self._interval_s = settings.clock_interval_s
        mpi = mpi_ready() if self.transport in ("auto", "mpi") else None
        if self.transport == "mpi" and mpi is None:
            log_once("clock:no_mpi", "tf_otel: clock sync over MPI requested but MPI is not ready")
            return False
        if mpi is not None:
            self.transport_used = "mpi"
            if topology.rank == 0:
                self.server = MpiServer(mpi)
                self.server.start()
            else:
                self._client = MpiClient(mpi, topology.rank)
        else:
            self.transport_used = "tcp"
            self.address = clock_address(topology, settings)
            if self.address is None:
                log_once(
                    "clock:no_address",
                    "tf_otel: rank 0's host is unknown; set TF_OTEL_COORDINATOR=HOST:PORT on "
                    "every rank for clock sync (the clock service uses PORT + 1); clocks stay "
                    "uncorrected",
                )
                return False
            if topology.rank == 0:
                self.server = TcpServer(bind_host(topology, self.address[0]), self.address[1])
                try:
                    self.server.start()
                except OSError as exc:
                    log_once(
                        "clock:bind",
                        "tf_otel: clock service cannot listen on port %d (%s); clocks stay "
                        "uncorrected",
                        self.address[1],
                        exc,
                    )
                    self.server = None
                    return False
            else:
                self._client = TcpClient(self.address[0], self.address[1], topology.rank)
            self.share = self._host_share(topology, settings)
        if self.transport_used == "mpi":
            atexit.register(self.stop)  # before mpi4py's own finalize (atexit runs LIFO)
        if topology.rank != 0:
            if topology.local_rank > 0:
                self._lead_after = time.monotonic() + LEAD_GRACE_S
            sharing = self.share is not None and topology.local_size > 1
            self._start_spread_s = start_spread_s(topology.world_size, topology.local_size, sharing)
            self._thread = threading.Thread(
                target=self._run, name="tf_otel-clock-sync", daemon=True
            )
            self._thread.start()
        return True

    def _host_share(self, topology: Topology, settings: Settings) -> Optional[HostShare]:
        """The host's shared model where ranks share the host's clock (never under the test
        clock, which gives each rank a clock of its own); rank 0 leads its own host at once,
        its model the identity."""
        if not self.share_host or topology.local_size <= 1 or settings.test_clock:
            return None
        share = HostShare.for_job(topology.job_id, topology.host)
        if share is not None and topology.rank == 0 and share.claim():
            share.publish(clock.IDENTITY, SETTLED_ROUNDS)  # exact: nothing to settle
        return share

    def resync_now(self, wait_s: Optional[float] = None) -> bool:
        """Ask for a round now. With ``wait_s`` (never on the training thread) wait for it."""
        if self._thread is None:
            return False
        with self._round_done:
            before = self.stats.rounds + self.stats.failed_rounds
            self._wake.set()
            if wait_s is None:
                return True
            self._round_done.wait_for(
                lambda: self.stats.rounds + self.stats.failed_rounds > before, timeout=wait_s
            )
            return self.stats.rounds + self.stats.failed_rounds > before

    def wait_rounds(self, n: int, timeout_s: float) -> bool:
        """Wait until ``n`` successful rounds have run (clock-check, tests)."""
        with self._round_done:
            return self._round_done.wait_for(lambda: self.stats.rounds >= n, timeout=timeout_s)

    def stop(self, timeout_s: Optional[float] = None) -> None:
        """Run a final round (short timeout), then stop the thread and the server."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            limit = self.final_timeout_s * 2 + 0.5
            if timeout_s is not None:  # what is left of the exit's time (services.stop)
                limit = min(limit, timeout_s)
            self._thread.join(timeout=limit)
        if self.server is not None:
            self.server.close()
        if self._client is not None:
            self._client.close()
        if self.share is not None:
            self.share.release()  # another rank of the host takes over, if any still runs

    # -- the measuring thread ------------------------------------------------------------------

    def _run(self) -> None:
        delay = 0.0
        warm = self.warmup_first_s
        backoff = BACKOFF_FIRST_S
        started = False
        while True:
            self._wake.wait(delay)
            self._wake.clear()
            final = self._stopping.is_set()
            share = self.share
            if share is not None and not self._claim(share):  # another rank of this host leads
                if final:
                    return
                with fail_open("clock.follow"):
                    self._follow(share)
                delay = FOLLOW_EARLY_S if self.stats.rounds < SETTLED_ROUNDS else FOLLOW_S
                continue
            if not started and not final:  # this rank runs rounds: start apart from the others
                started = True
                delay = random.uniform(0.0, self._start_spread_s)
                if delay > 0:
                    continue
            ok = False
            with fail_open("clock.round"):
                ok = self._round(final)
                if ok and share is not None:
                    share.publish(self.model, self.stats.rounds)
            if final:
                return
            if ok:
                backoff = BACKOFF_FIRST_S
                delay = min(warm, self._interval_s)
                warm *= 2
            else:  # jittered: clients that failed together do not retry together
                delay = min(backoff, self._backoff_cap_s()) * random.uniform(0.5, 1.0)
                backoff *= 2

    def _claim(self, share: HostShare) -> bool:
        """Lead the host's sync if nobody does, once the first rank of the host had its chance
        (LEAD_GRACE_S)."""
        if not share.leading and time.monotonic() < self._lead_after:
            return False
        return share.claim()

    def _backoff_cap_s(self) -> float:
        """The longest wait before a failed round's retry: BACKOFF_MAX_S while rank 0 has never
        answered (at start-up it is usually not listening yet, which costs it nothing), then
        the sync interval (it answered, so now it is overloaded: a round failing again and
        again comes 0.5-1 interval apart, about as often as the planned rounds)."""
        if self.stats.rounds:
            return self._interval_s
        return min(BACKOFF_MAX_S, self._interval_s)

    def _follow(self, share: HostShare) -> None:
        """Take the host leader's model (and its rounds, for wait_rounds) when it has a new one."""
        got = share.read()
        if got is None:
            return
        model, rounds = got
        with self._round_done:
            if model == self.model and rounds == self.stats.rounds:
                return
            self.model = model
            if self.publish:
                clock.set_model(model)
            self.stats.rounds = rounds
            self._round_done.notify_all()
        count("clock.host_model")

    def _round(self, final: bool = False) -> bool:
        client = self._client
        timeout = self.final_timeout_s if final else self.exchange_timeout_s
        if final and not self.stats.rounds:
            return False  # never connected: do not hold up shutdown
        t_start = time.perf_counter()
        try:
            if not client.connected:
                client.connect(self.final_timeout_s if final else self.connect_timeout_s)
            exchanges = client.exchange(self.exchanges, timeout)
        except OSError as exc:
            self._failed(exc, final)
            return False
        kept = estimate.select(exchanges)
        self._window.append(kept)
        while len(self._window) > self.window_rounds:
            self._window.popleft()
        samples = [s for round_ in self._window for s in round_]
        prior = self.fit.model.drift if self.fit is not None else 0.0
        fit = estimate.fit(samples, prior_drift=prior)
        with self._round_done:
            if fit is not None:
                self.fit = fit
                self.model = fit.model
                if self.publish:
                    clock.set_model(fit.model)
            self.stats.rounds += 1
            self.stats.last_round = estimate.round_stats(exchanges, kept)
            self.stats.last_round_s = time.perf_counter() - t_start
            self.stats.bytes_sent = client.bytes_out
            self.stats.bytes_received = client.bytes_in
            self._round_done.notify_all()
        count("clock.rounds")
        return True

    def _failed(self, exc: BaseException, final: bool = False) -> None:
        count("clock.round_failed")
        with self._round_done:
            self.stats.failed_rounds += 1
            self._round_done.notify_all()
        if final:
            return  # rank 0 may already be gone at shutdown: not worth a log line
        logger.debug("tf_otel: clock round failed (%s rounds so far): %r", self.stats.rounds, exc)
        now = time.monotonic()
        if self._first_failure is None:
            self._first_failure = now
        if now - self._first_failure < QUIET_START_S and not self.stats.rounds:
            return  # rank 0 is usually just not listening yet at start-up
        where = self.address or ("rank 0 over MPI", 0)
        log_once(
            "clock:unreachable",
            "tf_otel: clock sync with rank 0 (%s:%s) failed (%s); retrying in the background, "
            "timestamps stay uncorrected until it succeeds",
            where[0],
            where[1],
            exc,
        )

    # -- reporting (clock-check) ---------------------------------------------------------------

    def report(self) -> Dict[str, Any]:
        """This rank's result as plain data (sent to rank 0 by clock-check)."""
        model = self.model
        last = self.stats.last_round
        out: Dict[str, Any] = {
            "rank": self.rank,
            "transport": self.transport_used,
            "offset_ns": model.offset_at(clock.now_ns()),
            "drift_ppm": model.drift * 1e6,
            "uncertainty_ns": model.uncertainty_ns,
            "residual_ns": self.fit.residual_ns if self.fit else 0.0,
            "rounds": self.stats.rounds,
            "rtt_min_ns": last.rtt_min_ns if last else 0,
            "rtt_median_ns": last.rtt_median_ns if last else 0,
            "round_s": self.stats.last_round_s,
            "bytes": self.stats.bytes_sent + self.stats.bytes_received,
        }
        shift = clock.test_clock()
        if shift is not None:
            local = clock.now_ns()
            out["injected_offset_ns"] = -shift.error_at_local(local)
            out["error_ns"] = model.offset_at(local) + shift.error_at_local(local)
        return out

    def send_report(self, timeout_s: float = 2.0) -> bool:
        if self._client is None:
            return False
        try:
            self._client.send_report(self.report(), timeout_s)
            return True
        except OSError as exc:
            log_once("clock:report", "tf_otel: cannot send the clock report to rank 0 (%s)", exc)
            return False


def start_sync(topology: Topology, settings: Settings, **options: Any) -> Optional[ClockSync]:
    """Start clock sync on this rank (call once at start-up on every rank); never raises."""
    if topology.world_size <= 1:
        return None
    with fail_open("clock.start"):
        sync = ClockSync(**options)
        if sync.start(topology, settings):
            return sync
    return None


__all__ = ["ClockSync", "SyncStats", "start_sync", "clock_address"]
