"""Rank 0's services under many simulated ranks: CPU, connection set-up, root completeness.

No TensorFlow. Rank 0 is one process running the product's own services (``StepAggregator``
for step extents, ``ClockSync``'s TCP clock server); the other ranks are threads in a few
processes, each with the product's own ``CoordinatorClient`` and ``ClockSync`` client over real
TCP with the HMAC handshake. Every rank reports each step's extent at STEPS_PER_S (the same
steps at the same wall times on every rank, as a synchronous job does). By default each
simulated host's ranks go through their host relay (cluster/host_relay.py: one rank a host
elected, one connection and one message a step and host to rank 0; rank 0's own host's ranks
direct), as the product does where a host runs several ranks; ``--no-relay`` is the control
(every rank connected to rank 0).

``--light-hosts``: a lighter simulation, for 1,024 ranks and more on a small machine. Each
simulated host but rank 0's is ONE instance of the product's own relay (``HostRelay``: its link
to rank 0 is the product's ``CoordinatorClient`` with the relay hello, real TCP, the HMAC
handshake) fed in-process with its 8 ranks' extents each step (``HostRelay.serve_local`` /
``report_local``), and one ``ClockSync`` (the host's clock leader); bypassed is only the
host-local loopback hop from a rank to its relay (its own client, connection and thread), which
never reaches rank 0. Rank 0's own host's ranks are direct ``CoordinatorClient``s as in the
default mode. Both modes build their ranks in one function (``_part``).

Usage::

    python bench/bench_rank0.py                       # 64, 256, 1024 ranks, 40 s each
    python bench/bench_rank0.py --ranks 256 --seconds 30 --out /tmp/rank0.md
    python bench/bench_rank0.py --ranks 256 --no-relay     # the control: no host relays
    python bench/bench_rank0.py --ranks 1024,4096 --light-hosts  # one relay a host, in-process
    python bench/bench_rank0.py --ranks 1024 --light-hosts --profile /tmp/loop.pstats

``--out FILE`` rewrites only FILE's generated section (between its ``bench_rank0`` markers;
appended where there is none): the hand-written text around it stays. ``--profile`` adds
cProfile's cost to the coordinator loop's CPU: read its figures for where, not how much.

    import bench_rank0; result = bench_rank0.measure(256, seconds=20)
    result["connected_s"], result["complete_steady"], result["cores"]

What rank 0 measures (its own process): CPU in all, and over the run's second half (after the
clients' quick first clock rounds) in cores and in microseconds per rank-step, and by thread;
the time until every rank's coordinator connection was accepted and until every clock client
connected; the connections rank 0 holds at the end; roots complete (every rank's extent in them)
among the steady steps (after the first LEARN steps and once every rank was connected). The
bench's own polling in rank 0's process slows to twice a second once every rank is connected.
Not simulated: Horovod collective detail (the per-step arrival answers); root export (rank 0's
``emit_root`` here only records the root).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import harness  # bench/ is on sys.path: run as a script, or put there by the caller

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

STEPS_PER_S = 2.0
RANKS_PER_PROCESS = 128
LIGHT_RANKS_PER_PROCESS = 1024  # --light-hosts: 128 simulated hosts (relays) a process
KEY = "bench_step"
SECRET = "bench-rank0-secret-0123456789abcdef"
RELAY_THREAD = "tf_otel-relay"  # a host relay's event loop (cluster/host_relay.py)
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


class _Run(NamedTuple):
    """One run's settings, as rank 0's process and the simulated ranks' processes get them."""

    world: int
    seconds: float
    port: int
    t0: float
    per_host: int
    relay: bool
    light: bool

    def words(self) -> List[str]:
        """The settings as command-line words (``parse`` reads them back)."""
        flags = [str(int(self.relay)), str(int(self.light))]
        return (
            [str(self.world), str(self.seconds), str(self.port), repr(self.t0)]
            + [str(self.per_host)]
            + flags
        )

    @classmethod
    def parse(cls, words: List[str]) -> _Run:
        world, seconds, port, t0, per_host, relay, light = words
        return cls(
            int(world),
            float(seconds),
            int(port),
            float(t0),
            int(per_host),
            relay == "1",
            light == "1",
        )


def _rank0(run: _Run, profile: str = "") -> None:
    """Rank 0's process: serve until the ranks stop, then print what it measured (JSON)."""
    world, seconds, port, t0, per_host, relay, light = run
    from tf_otel import health
    from tf_otel.clock.sync import ClockSync
    from tf_otel.cluster.coordinator import LEARN_STEPS, StepAggregator
    from tf_otel.cluster.relay_route import lead_directly
    from tf_otel.config import Settings

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
    profiler: Any = None
    pings_from = 0
    while time.time() < t0 + seconds - 1:
        # this polling runs in rank 0's process: often only until every rank is connected
        time.sleep(0.05 if connected_at is None or clock_at is None else 0.5)
        now = time.time()
        if connected_at is None:
            connected = max(connected, len(aggregator.connected_ranks()))
        connections = aggregator.connection_count()
        if connected_at is None and connected >= world - 1:
            connected_at = now
        if clock_at is None and sync.server is not None and sync.server.connections >= leaders:
            clock_at = now
        if cpu_from is None and now >= half:
            cpu_from, wall_from = time.process_time(), time.monotonic()
            threads_from = harness.thread_cpu()
            pings_from = _pings(sync)
            if profile:  # the coordinator loop's own CPU, by function (cProfile on its thread)
                profiler = _on_loop(aggregator, _start_profile)
    if profiler is not None:
        _on_loop(aggregator, profiler.disable)
        profiler.dump_stats(profile)
    cpu_all = time.process_time() - cpu_start
    threads_to = harness.thread_cpu()
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
            # clock pings rank 0 answered in all, and in the second half (the CPU's window)
            "clock_pings": _pings(sync),
            "second_half_clock_pings": None if cpu_from is None else _pings(sync) - pings_from,
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


def _pings(sync: Any) -> int:
    """Clock pings rank 0's clock service answered so far (a ping frame is 16 bytes)."""
    return 0 if sync.server is None else int(sync.server.bytes_in) // 16


def _start_profile() -> Any:
    import cProfile

    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()  # on the calling thread only (Python 3.11)
    return profiler


def _on_loop(aggregator: Any, call: Any) -> Any:
    """``call()`` run on the coordinator's event loop thread; its result."""
    done: queue.Queue[Any] = queue.Queue()
    aggregator._loop.call_soon_threadsafe(lambda: done.put(call()))
    return done.get(timeout=5)


def _own_steps(aggregator: Any, seconds: float, t0: float) -> None:
    """Rank 0's own steps: its extent goes straight to its aggregator, as in a job."""
    for step in range(int(seconds * STEPS_PER_S)):
        time.sleep(max(0.0, t0 + step / STEPS_PER_S - time.time()))
        start = time.time_ns()
        aggregator.add(0, KEY, step, start, start + 200_000_000)


def _settings(port: int, relay: bool = True) -> Any:
    from tf_otel.config import Settings

    return Settings(coordinator=("127.0.0.1", port), host_relay=relay)


def _part(first: int, last: int, run: _Run) -> None:
    """Simulated ranks first..last-1: their links connect (each rank's own, through its
    host's relay where relays are on, as services.start_services does), then report every step.
    ``light``: every host but rank 0's is ONE product HostRelay fed in-process
    (HostRelay.serve_local) and one ClockSync, the host's clock leader."""
    world, seconds, port, t0, per_host, relay, light = run
    from tf_otel import health
    from tf_otel.cluster.host_relay import HostRelay
    from tf_otel.cluster.relay_route import RELAY_WAIT_MAX_S, close_link, coordinator_link

    settings = _settings(port, relay)
    clients, syncs = [], []
    hosts: Dict[int, List[int]] = {}
    for rank in range(first, last):
        if light and rank >= per_host:  # not rank 0's host: one relay for the host, below
            hosts.setdefault(rank // per_host, []).append(rank)
            continue
        topology = _topology(rank, world, per_host, port)
        # rank0_host_direct=False: one machine plays every host (rank 0's host: its election
        # says "direct")
        clients.append(coordinator_link(settings, topology, ("127.0.0.1", port), None, None, False))
        syncs.append(_clock(topology, port))
    relays: List[Tuple[HostRelay, List[int]]] = []
    wait_s = min(RELAY_WAIT_MAX_S, settings.root_wait_ms / 4000.0)  # as coordinator_link
    for ranks in hosts.values():
        host = HostRelay(("127.0.0.1", port), ranks[0], world, wait_s)
        if host.serve() is None:
            raise SystemExit("a host relay cannot listen")
        host.serve_local(ranks)
        relays.append((host, ranks))
        syncs.append(_clock(_topology(ranks[0], world, per_host, port), port))
    steps = int(seconds * STEPS_PER_S)
    relay_from: Optional[Tuple[float, Dict[str, float]]] = None
    for step in range(steps):
        time.sleep(max(0.0, t0 + step / STEPS_PER_S - time.time()))
        if step == steps // 2:  # the relays' own CPU over the second half, as rank 0's
            relay_from = (time.monotonic(), harness.thread_cpu())
        start = time.time_ns()
        end = start + 200_000_000
        for client in clients:
            client.report(KEY, step, start, end)
        for host, ranks in relays:
            host.report_local(KEY, step, [(rank, start, end) for rank in ranks])
    relay_cost = _relay_cost(relay_from)
    # never connected by the end (to rank 0 or to a relay): what a missing rank was doing
    unconnected = [c.rank for c in clients if c.connected_to is None]
    unconnected += [rank for host, ranks in relays if not host.linked for rank in ranks]

    def close_host(host: HostRelay, ranks: List[int]) -> None:
        host.leave_local(ranks)
        host.close(2.0)

    closing = [threading.Thread(target=close_link, args=(c, 2.0)) for c in clients]
    closing += [threading.Thread(target=close_host, args=pair) for pair in relays]
    closing += [threading.Thread(target=s.stop, args=(0.5,)) for s in syncs]
    for thread in closing:  # at once: one after another, a thousand ranks take minutes
        thread.start()
    for thread in closing:
        thread.join()
    said = {
        "ranks": [first, last],
        "handshakes_failed": health.counters["coordinator_handshake_failed"],
        "unconnected": unconnected,
        "cpu_s": time.process_time(),  # the simulated ranks' own cost (relays included)
        **relay_cost,
    }
    print(json.dumps(said), flush=True)


def _relay_cost(since: Optional[Tuple[float, Dict[str, float]]]) -> Dict[str, Any]:
    """What the host relays in this process cost from ``since`` (wall time, ``thread_cpu``) to
    now: CPU seconds of their event loop threads, the threads' count and the wall time. In a
    job each runs in its leader rank's training process: this is what it takes from it."""
    if since is None:
        return {}
    wall_from, threads_from = since
    threads = [t for t in threading.enumerate() if t.name == RELAY_THREAD]
    spent = harness.thread_cpu().get(RELAY_THREAD, 0.0) - threads_from.get(RELAY_THREAD, 0.0)
    return {
        "relay_threads": len(threads),
        "relay_cpu_s": round(spent, 3),
        "relay_wall_s": round(time.monotonic() - wall_from, 2),
    }


def _clock(topology: Any, port: int) -> Any:
    """A simulated rank's ClockSync (the host's leader runs the rounds, as in the product)."""
    from tf_otel.clock.sync import ClockSync

    sync = ClockSync(publish=False, share_host=True)
    sync.start(topology, _settings(port))
    return sync


def measure(
    world: int,
    seconds: float = 40.0,
    per_host: int = PER_HOST,
    per_process: int = RANKS_PER_PROCESS,
    relay: bool = True,
    light: bool = False,
    profile: str = "",
) -> Dict:
    """One run at ``world`` ranks (host relays on, or off: the control; ``light``: one
    in-process relay a simulated host, see the module docstring); rank 0's result."""
    port = harness.free_port_pair()
    env = _env(port)
    t0 = time.time() + 3.0  # every process starts its clock of steps at the same wall time
    me = [sys.executable, str(Path(__file__).resolve())]
    args = _Run(world, seconds, port, t0, per_host, relay, light).words()
    if light:  # whole hosts a process (a multiple of per_host)
        per_process = max(per_host, LIGHT_RANKS_PER_PROCESS // per_host * per_host)
        relay = True
    rank0 = subprocess.Popen(
        [*me, "--rank0", *args, profile],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
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
    relay_cpu, relay_threads, relay_wall = 0.0, 0, 0.0
    for part in parts:
        try:
            said = part.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            part.kill()
            said = part.communicate()[0]
        for line in said.splitlines():
            if line.startswith("{"):
                said = json.loads(line)
                failed += said.get("handshakes_failed", 0)
                unconnected += said.get("unconnected", [])
                parts_cpu += said.get("cpu_s", 0.0)
                relay_cpu += said.get("relay_cpu_s", 0.0)
                relay_threads += said.get("relay_threads", 0)
                relay_wall = max(relay_wall, said.get("relay_wall_s", 0.0))
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"rank 0 printed no result: {err[-2000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    result["handshakes_failed"] = failed  # on the ranks' side: each was tried again
    result["unconnected"] = sorted(unconnected)  # ranks whose link never connected anywhere
    result["parts_cpu_s"] = round(parts_cpu, 1)  # every simulated rank's process, in all
    # one host relay's CPU (second half), taken from its leader rank's process in a job
    result["relays"] = relay_threads
    if relay_threads and relay_wall:
        per_relay = relay_cpu / relay_threads / relay_wall
        result["relay_cores"] = round(per_relay, 5)
        # a relay serves its host's ranks (its leader's own included)
        result["relay_us_per_rank_step"] = round(per_relay * 1e6 / (STEPS_PER_S * per_host), 1)
    return result


def _table(results: List[Dict]) -> str:
    rows = [
        "| ranks | host relays | connections at rank 0 | every rank connected after "
        "| host clock leaders connected after | steady roots complete "
        "| rank-0 CPU, cores (second half) | µs per rank-step | rank-0 CPU in all "
        "| one host relay's CPU, cores (µs per relayed rank-step) "
        "| load average (1, 5, 15 min) at the end |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r['ranks']} | {'light' if r.get('light') else 'on' if r['relay'] else 'off'} "
            f"| {r['connections']} "
            f"| {r['connected_s']} s ({r['connected']} of {r['ranks']}) "
            f"| {r['clock_connected_s']} s ({r['clock_leaders']}) "
            f"| {r['complete_steady']} of {r['steady_steps']} "
            f"| {r['cores']} | {r['us_per_rank_step']} | {r['cpu_s']} s "
            f"| {_relay_column(r)} | {r.get('load_average')} |"
        )
    return "\n".join(rows)


def _relay_column(result: Dict) -> str:
    if "relay_cores" not in result:
        return "no relay"
    return f"{result['relay_cores']} ({result['relay_us_per_rank_step']})"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("--rank0", "--part"):
        if sys.argv[1] == "--rank0":
            _rank0(_Run.parse(sys.argv[2:9]), sys.argv[9])
        else:
            _part(int(sys.argv[2]), int(sys.argv[3]), _Run.parse(sys.argv[4:11]))
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
    parser.add_argument(
        "--out", help="write the table into this markdown file's generated section too"
    )
    parser.add_argument(
        "--profile", default="", help="cProfile of rank 0's coordinator loop (second half)"
    )
    options = parser.parse_args()
    results = []
    relays = not options.no_relay
    for size in (int(n) for n in options.ranks.split(",")):
        print(f"{size} ranks, {options.seconds:.0f} s ...", file=sys.stderr, flush=True)
        results.append(
            measure(
                size,
                options.seconds,
                options.per_host,
                relay=relays,
                light=options.light_hosts,
                profile=options.profile,
            )
        )
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    table = _table(results)
    print(table)
    if options.out:  # only the file's generated section: its hand-written text stays
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        write_doc(
            Path(options.out),
            f"## Latest run\n\n"
            f"`python bench/bench_rank0.py --ranks {options.ranks} --seconds "
            f"{options.seconds:.0f} --per-host {options.per_host}"
            f"{' --no-relay' if options.no_relay else ''}"
            f"{' --light-hosts' if options.light_hosts else ''}`, {when}, load average "
            f"{os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores shared by rank 0 "
            f"and every simulated rank.\n\n{table}",
        )


def write_doc(path: Path, text: str) -> None:
    """``text`` as the generated section of the doc at ``path``; the rest of the file stays."""
    harness.write_generated(
        path, "bench_rank0", text, "Rank 0 under many simulated ranks (issue 26)"
    )


if __name__ == "__main__":
    main()
