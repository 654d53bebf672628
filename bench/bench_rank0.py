"""Rank 0's services under many simulated ranks: CPU, connection set-up, root completeness.

No TensorFlow. Rank 0 is one process running the product's own services (``StepAggregator``
for step extents, ``ClockSync``'s TCP clock server); the other ranks are threads in a few
processes, each with the product's own ``CoordinatorClient`` and ``ClockSync`` client over real
TCP with the HMAC handshake. Every rank reports each step's extent at STEPS_PER_S (the same
steps at the same wall times on every rank, as a synchronous job does). By default each
simulated host's ranks go through their host relay (pipeline/host_relay.py: one rank a host
elected, one connection and one message a step and host to rank 0; rank 0's own host's ranks
direct), as the product does where a host runs several ranks; ``--no-relay`` is the control
(every rank connected to rank 0).

``--light-hosts``: a lighter simulation, for 1,024 ranks and more on a small machine. Each
simulated host but rank 0's is ONE instance of the product's own relay (``HostRelay``: its link
to rank 0 is the product's ``CoordinatorClient`` with the relay hello, real TCP, the HMAC
handshake) fed in-process with its 8 ranks' extents each step, and one ``ClockSync`` (the host's
clock leader); bypassed is only the host-local loopback hop from a rank to its relay (its own
client, connection and thread), which never reaches rank 0. Rank 0's own host's ranks are
direct ``CoordinatorClient``s as in the default mode.

Usage::

    python bench/bench_rank0.py                       # 64, 256, 1024 ranks, 40 s each
    python bench/bench_rank0.py --ranks 256 --seconds 30 --out /tmp/rank0.md
    python bench/bench_rank0.py --ranks 256 --no-relay     # the control: no host relays
    python bench/bench_rank0.py --ranks 1024,4096 --light-hosts  # one relay a host, in-process

    import bench_rank0; result = bench_rank0.measure(256, seconds=20)
    result["connected_s"], result["complete_steady"], result["cores"]

What rank 0 measures (its own process): CPU in all, and over the run's second half (after the
clients' quick first clock rounds) in cores and in microseconds per rank-step; the time until every rank's coordinator
connection was accepted and until every clock client connected; the connections rank 0 holds
at the end; roots complete (every rank's extent in them) among the steady steps (after the first
LEARN steps and once every rank was connected). Not simulated: Horovod collective detail (the per-step arrival answers).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

STEPS_PER_S = 2.0
RANKS_PER_PROCESS = 128
LIGHT_RANKS_PER_PROCESS = 1024  # --light-hosts: 128 simulated hosts (relays) a process
KEY = "bench_step"
SECRET = "bench-rank0-secret-0123456789abcdef"
PER_HOST = 8  # ranks a simulated host: one of them syncs the host's clock with rank 0


def _env(port: int) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_OTEL_", "OTEL_"))}
    env.update(
        TF_OTEL_JOB_SECRET=SECRET,
        TF_OTEL_COORDINATOR=f"127.0.0.1:{port}",
        PYTHONPATH=str(REPO),
    )
    return env


def _topology(rank: int, world: int, per_host: int, port: int) -> Any:
    """Rank ``rank`` on simulated host ``rank // per_host`` (rank 0's host is host 0)."""
    from tf_otel.job.topology import Topology

    return Topology(
        rank=rank,
        world_size=world,
        local_rank=rank % per_host,
        local_size=per_host,
        host=f"sim-host-{rank // per_host}",
        job_id=f"bench-rank0-{port}",  # the same in every process of one run
    )


def _rank0(
    world: int, seconds: float, port: int, t0: float, per_host: int, relay: bool, light: bool
) -> None:
    """Rank 0's process: serve until the ranks stop, then print what it measured (JSON)."""
    from tf_otel import health
    from tf_otel.clock.sync import ClockSync
    from tf_otel.config import Settings
    from tf_otel.pipeline.coordinator import LEARN_STEPS, StepAggregator
    from tf_otel.pipeline.host_relay import lead_directly

    roots: Dict[int, Tuple[int, bool]] = {}
    lock = threading.Lock()

    def emit_root(key: str, step: int, start: int, end: int, n: int, partial: Any, _e: Any) -> None:
        with lock:
            roots[step] = (n, partial is None)

    wait_s = Settings().root_wait_ms / 1000  # the default
    aggregator = StepAggregator(world, wait_s, emit_root)
    if not aggregator.serve(("127.0.0.1", port)):
        raise SystemExit("rank 0: cannot listen")
    sync = ClockSync(publish=False, share_host=True)
    sync.start(_topology(0, world, per_host, port), _settings(port))
    # as services.start_services: rank 0's host's ranks talk to it directly
    topology = _topology(0, world, per_host, port)
    election = lead_directly(_settings(port, relay), topology, aggregator.secret)
    threading.Thread(target=_own_steps, args=(aggregator, seconds, t0), daemon=True).start()
    print("ready", flush=True)
    connected_at: Optional[float] = None
    clock_at: Optional[float] = None
    connected = 0
    connections = 0
    leaders = (world - 1) // per_host  # one a host but rank 0's: they sync the hosts' clocks
    cpu_start = time.process_time()
    half = t0 + seconds / 2  # the clients' first clock rounds come quickly: CPU after them
    cpu_from: Optional[float] = None
    wall_from = 0.0
    threads_from: Dict[str, float] = {}
    while time.time() < t0 + seconds - 1:
        time.sleep(0.05)
        now = time.time()
        connected = max(connected, len(aggregator.connected_ranks()))
        connections = aggregator.connection_count()
        if connected_at is None and connected >= world - 1:
            connected_at = now
        if clock_at is None and sync.server is not None and sync.server.connections >= leaders:
            clock_at = now
        if cpu_from is None and now >= half:
            cpu_from, wall_from = time.process_time(), time.monotonic()
            threads_from = _thread_cpu()
    cpu_all = time.process_time() - cpu_start
    threads_to = _thread_cpu()
    by_thread = {  # the second half, by thread name (threads alive at both ends)
        name: round(threads_to[name] - threads_from.get(name, 0.0), 2)
        for name in threads_to
        if cpu_from is not None and threads_to[name] - threads_from.get(name, 0.0) >= 0.01
    }
    cpu = time.process_time() - cpu_from if cpu_from is not None else None
    wall = time.monotonic() - wall_from if cpu_from is not None else None
    aggregator.flush(wait_s + 2)
    first_steady = None
    if connected_at is not None:
        first_steady = max(LEARN_STEPS, int((connected_at - t0) * STEPS_PER_S) + 2)
    with lock:
        steady = {s: v for s, v in roots.items() if first_steady is not None and s >= first_steady}
        last = int(seconds * STEPS_PER_S) - 2  # the last steps may end after the ranks stop
        steady = {s: v for s, v in steady.items() if s < last}
        result = {
            "ranks": world,
            "relay": relay,
            "light": light,
            "seconds": seconds,
            "connections": connections,
            "connected": connected + 1,
            "connected_s": None if connected_at is None else round(connected_at - t0, 2),
            "load_average": [round(x, 1) for x in os.getloadavg()],
            "clock_leaders": leaders,
            "clock_connected_s": None if clock_at is None else round(clock_at - t0, 2),
            "roots": len(roots),
            "steady_steps": len(steady),
            "complete_steady": sum(1 for _, whole in steady.values() if whole),
            # every root, start-up included: how many held every rank, the most ranks in one
            "complete_roots": sum(1 for _, whole in roots.values() if whole),
            "most_ranks_in_a_root": max((n for n, _ in roots.values()), default=0),
            # every extent rank 0 got: in a root, or after its root was out (late)
            "extents_in_roots": sum(n for n, _ in roots.values()),
            "late_extents": health.counters["roots_late_extent"],
            "cpu_s": round(cpu_all, 2),
            "second_half_cpu_s_by_thread": by_thread,
            "refused": health.counters["coordinator_refused"] + health.counters["clock_refused"],
            "cores": None if cpu is None or not wall else round(cpu / wall, 4),
            "us_per_rank_step": (
                None
                if cpu is None or not wall
                else round(cpu * 1e6 / (wall * STEPS_PER_S * world), 1)
            ),
        }
    print("RESULT " + json.dumps(result), flush=True)
    sync.stop(0.5)
    aggregator.close()
    if election is not None:
        election.release()


def _thread_cpu() -> Dict[str, float]:
    """CPU seconds so far of this process's live threads, summed by thread name (from /proc:
    where rank 0's CPU goes: its coordinator loop, its clock service, its own steps)."""
    ticks = os.sysconf("SC_CLK_TCK")
    spent: Dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, ...
        cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
        spent[thread.name] = spent.get(thread.name, 0.0) + cpu
    return spent


def _own_steps(aggregator: Any, seconds: float, t0: float) -> None:
    """Rank 0's own steps: its extent goes straight to its aggregator, as in a job."""
    for step in range(int(seconds * STEPS_PER_S)):
        time.sleep(max(0.0, t0 + step / STEPS_PER_S - time.time()))
        start = time.time_ns()
        aggregator.add(0, KEY, step, start, start + 200_000_000)


def _settings(port: int, relay: bool = True) -> Any:
    from tf_otel.config import Settings

    return Settings(coordinator=("127.0.0.1", port), host_relay=relay)


def _ranks(
    first: int,
    last: int,
    world: int,
    seconds: float,
    port: int,
    t0: float,
    per_host: int,
    relay: bool,
) -> None:
    """Simulated ranks first..last-1: their clients connect (through their host's relay, as
    services.start_services does), then report every step."""
    from tf_otel import health
    from tf_otel.clock.sync import ClockSync
    from tf_otel.pipeline.host_relay import close_link, coordinator_link

    clients, syncs = [], []
    for rank in range(first, last):
        topology = _topology(rank, world, per_host, port)
        clients.append(
            coordinator_link(
                _settings(port, relay),
                topology,
                ("127.0.0.1", port),
                None,
                rank0_host_direct=False,  # one machine plays every host
            )
        )
        sync = ClockSync(publish=False, share_host=True)
        sync.start(_topology(rank, world, per_host, port), _settings(port))
        syncs.append(sync)
    steps = int(seconds * STEPS_PER_S)
    for step in range(steps):
        begin = t0 + step / STEPS_PER_S
        time.sleep(max(0.0, begin - time.time()))
        start = time.time_ns()
        end = start + 200_000_000
        for client in clients:
            client.report(KEY, step, start, end)
    # never connected by the end (to rank 0 or to a relay): what a missing rank was doing
    unconnected = [c.rank for c in clients if c.connected_to is None]
    closing = [threading.Thread(target=close_link, args=(c, 2.0)) for c in clients]
    closing += [threading.Thread(target=s.stop, args=(0.5,)) for s in syncs]
    for thread in closing:  # at once: one after another, a thousand ranks take minutes
        thread.start()
    for thread in closing:
        thread.join()
    failed = health.counters["coordinator_handshake_failed"]
    said = {
        "ranks": [first, last],
        "handshakes_failed": failed,
        "unconnected": unconnected,
        "cpu_s": time.process_time(),  # the simulated ranks' own cost (relays included)
    }
    print(json.dumps(said), flush=True)


class _Sink:
    """A simulated rank's end of its relay connection (--light-hosts): what the relay sends it
    (rank 0's broadcasts, fanned out) is dropped, as a rank's client would read and drop it."""

    def __init__(self) -> None:
        self.transport = self

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        pass


def _light_hosts(
    first: int,
    last: int,
    world: int,
    seconds: float,
    port: int,
    t0: float,
    per_host: int,
) -> None:
    """--light-hosts: ranks first..last-1 (whole hosts). Rank 0's host's ranks as in _ranks
    (direct clients); every other host ONE product HostRelay (its own link to rank 0, relay
    hello, real TCP, HMAC) fed in-process with its ranks' extents, and one ClockSync."""
    from tf_otel import health
    from tf_otel.clock.sync import ClockSync
    from tf_otel.config import Settings
    from tf_otel.pipeline import messages
    from tf_otel.pipeline.host_relay import (
        RELAY_WAIT_MAX_S,
        HostRelay,
        close_link,
        coordinator_link,
    )

    settings = _settings(port)
    wait_s = min(RELAY_WAIT_MAX_S, Settings().root_wait_ms / 4000.0)  # as coordinator_link
    clients, syncs, relays = [], [], []
    hosts: Dict[int, List[int]] = {}
    for rank in range(first, last):
        if rank < per_host:  # rank 0's host: direct, as in _ranks
            topology = _topology(rank, world, per_host, port)
            clients.append(coordinator_link(settings, topology, ("127.0.0.1", port), None))
            sync = ClockSync(publish=False, share_host=True)
            sync.start(topology, settings)
            syncs.append(sync)
        else:
            hosts.setdefault(rank // per_host, []).append(rank)
    for ranks in hosts.values():
        relay = HostRelay(("127.0.0.1", port), ranks[0], world, wait_s)
        if relay.serve() is None:
            raise SystemExit("a host relay cannot listen")
        loop = relay._loop
        assert loop is not None

        def join(relay: HostRelay = relay, ranks: List[int] = ranks) -> None:
            for rank in ranks:  # as HostRelay._connection does once a rank's hello passed
                relay._ranks[rank] = _Sink()  # type: ignore[assignment]
                relay._up(messages.encode({"t": messages.JOIN, "r": rank}))

        loop.call_soon_threadsafe(join)
        relays.append((relay, ranks))
        sync = ClockSync(publish=False, share_host=True)  # the host's clock leader
        sync.start(_topology(ranks[0], world, per_host, port), settings)
        syncs.append(sync)

    def feed(relay: HostRelay, ranks: List[int], step: int, start: int, end: int) -> None:
        for rank in ranks:  # as HostRelay._serve_rank does with each rank's extent line
            relay._add(rank, messages.extent(KEY, step, start, end))

    for step in range(int(seconds * STEPS_PER_S)):
        time.sleep(max(0.0, t0 + step / STEPS_PER_S - time.time()))
        start = time.time_ns()
        end = start + 200_000_000
        for client in clients:
            client.report(KEY, step, start, end)
        for relay, ranks in relays:
            try:
                assert relay._loop is not None
                relay._loop.call_soon_threadsafe(feed, relay, ranks, step, start, end)
            except RuntimeError:  # its loop closed
                pass
    unconnected = [c.rank for c in clients if c.connected_to is None]
    for relay, ranks in relays:
        upstream = relay._upstream
        if upstream is None or upstream.connected_to is None:
            unconnected += ranks

    def leave(relay: HostRelay, ranks: List[int]) -> None:
        for rank in ranks:  # as HostRelay._connection does when a rank says bye
            relay._ranks.pop(rank, None)
            relay._up(messages.encode({"t": messages.LEAVE, "r": rank}))

    def close_host(relay: HostRelay, ranks: List[int]) -> None:
        try:
            assert relay._loop is not None
            relay._loop.call_soon_threadsafe(leave, relay, ranks)
        except RuntimeError:
            pass
        relay.close(2.0)

    closing = [threading.Thread(target=close_link, args=(c, 2.0)) for c in clients]
    closing += [threading.Thread(target=close_host, args=pair) for pair in relays]
    closing += [threading.Thread(target=s.stop, args=(0.5,)) for s in syncs]
    for thread in closing:
        thread.start()
    for thread in closing:
        thread.join()
    said = {
        "ranks": [first, last],
        "handshakes_failed": health.counters["coordinator_handshake_failed"],
        "unconnected": unconnected,
        "cpu_s": time.process_time(),
    }
    print(json.dumps(said), flush=True)


def measure(
    world: int,
    seconds: float = 40.0,
    per_host: int = PER_HOST,
    per_process: int = RANKS_PER_PROCESS,
    relay: bool = True,
    light: bool = False,
) -> Dict:
    """One run at ``world`` ranks (host relays on, or off: the control; ``light``: one
    in-process relay a simulated host, see the module docstring); rank 0's result."""
    import harness  # bench/ is on sys.path: run as a script, or put there by the caller

    port = harness.free_port_pair()
    env = _env(port)
    t0 = time.time() + 3.0  # every process starts its clock of steps at the same wall time
    me = [sys.executable, str(Path(__file__).resolve())]
    args = [str(world), str(seconds), str(port), repr(t0), str(per_host), str(int(relay))]
    args.append(str(int(light)))
    if light:  # whole hosts a process (a multiple of per_host)
        per_process = max(per_host, LIGHT_RANKS_PER_PROCESS // per_host * per_host)
        relay = True
    rank0 = subprocess.Popen(
        [*me, "--rank0", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert rank0.stdout is not None
    if rank0.stdout.readline().strip() != "ready":
        raise RuntimeError(f"rank 0 did not start: {rank0.communicate()[1][-2000:]}")
    parts: List[subprocess.Popen] = []
    bounds = list(range(1, world, per_process))
    if light:
        bounds = [1, *range(per_process, world, per_process)]
    for i, first in enumerate(bounds):
        last = bounds[i + 1] if i + 1 < len(bounds) else world
        parts.append(
            subprocess.Popen(
                [*me, "--part", str(first), str(last), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    out, err = rank0.communicate(timeout=seconds + 120)
    failed = 0
    unconnected: List[int] = []
    parts_cpu = 0.0
    for part in parts:
        try:
            said = part.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            part.kill()
            said = part.communicate()[0]
        for line in said.splitlines():
            if line.startswith("{"):
                failed += json.loads(line).get("handshakes_failed", 0)
                unconnected += json.loads(line).get("unconnected", [])
                parts_cpu += json.loads(line).get("cpu_s", 0.0)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"rank 0 printed no result: {err[-2000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    result["handshakes_failed"] = failed  # on the ranks' side: each was tried again
    result["unconnected"] = sorted(unconnected)  # ranks whose link never connected anywhere
    result["parts_cpu_s"] = round(parts_cpu, 1)  # every simulated rank's process, in all
    return result


def _table(results: List[Dict]) -> str:
    rows = [
        "| ranks | host relays | connections at rank 0 | every rank connected after "
        "| host clock leaders connected after | steady roots complete "
        "| rank-0 CPU, cores (second half) | µs per rank-step | rank-0 CPU in all "
        "| load average (1, 5, 15 min) at the end |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r['ranks']} | {'light' if r.get('light') else 'on' if r['relay'] else 'off'} "
            f"| {r['connections']} "
            f"| {r['connected_s']} s ({r['connected']} of {r['ranks']}) "
            f"| {r['clock_connected_s']} s ({r['clock_leaders']}) "
            f"| {r['complete_steady']} of {r['steady_steps']} "
            f"| {r['cores']} | {r['us_per_rank_step']} | {r['cpu_s']} s "
            f"| {r.get('load_average')} |"
        )
    return "\n".join(rows)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("--rank0", "--part"):
        if sys.argv[1] == "--rank0":
            world, seconds, port, t0, per_host, relay, light = sys.argv[2:9]
            _rank0(
                int(world),
                float(seconds),
                int(port),
                float(t0),
                int(per_host),
                relay == "1",
                light == "1",
            )
        else:
            first, last, world, seconds, port, t0, per_host, relay, light = sys.argv[2:11]
            if light == "1":
                _light_hosts(
                    int(first),
                    int(last),
                    int(world),
                    float(seconds),
                    int(port),
                    float(t0),
                    int(per_host),
                )
                return
            _ranks(
                int(first),
                int(last),
                int(world),
                float(seconds),
                int(port),
                float(t0),
                int(per_host),
                relay == "1",
            )
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="64,256,1024", help="comma-separated rank counts")
    parser.add_argument("--seconds", type=float, default=40.0, help="each run's length")
    parser.add_argument("--per-host", type=int, default=PER_HOST, help="ranks a host")
    parser.add_argument("--no-relay", action="store_true", help="the control: no host relays")
    parser.add_argument(
        "--light-hosts",
        action="store_true",
        help="one in-process product relay a simulated host (see the module docstring)",
    )
    parser.add_argument("--out", help="write the table (markdown) here too")
    options = parser.parse_args()
    results = []
    relays = not options.no_relay
    for size in (int(n) for n in options.ranks.split(",")):
        print(f"{size} ranks, {options.seconds:.0f} s ...", file=sys.stderr, flush=True)
        results.append(
            measure(
                size, options.seconds, options.per_host, relay=relays, light=options.light_hosts
            )
        )
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    table = _table(results)
    print(table)
    if options.out:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        load = os.getloadavg()[0]
        Path(options.out).write_text(
            f"# Rank 0 under many simulated ranks (issue 26)\n\n"
            f"`python bench/bench_rank0.py --ranks {options.ranks} --seconds "
            f"{options.seconds:.0f} --per-host {options.per_host}"
            f"{' --no-relay' if options.no_relay else ''}"
            f"{' --light-hosts' if options.light_hosts else ''}`, {when}, load average "
            f"{load:.1f} at the end, on 2 cores shared by rank 0 and every simulated rank.\n\n"
            + (__doc__ or "").split("\n\n", 1)[1].split("Usage::")[0]
            + table
            + "\n"
        )


if __name__ == "__main__":
    main()
