"""A simulated cluster for tests and benchmarks: hosts as network namespaces on one machine
(scripts/cluster/netcluster.py), jobs launched as users launch them, horovodrun / mpirun over ssh
from a separate ``login`` host, with faults injected per host.

Usage::

    from sim import Cluster

    with Cluster(hosts=2, slots=2, skew_ns={"hostB": 1_500_000_000},
                 slow_link={"hostB": "20mbit"}, cpus={"hostB": "1"}, cpu_hog={"hostB": 1}) as c:
        with OtlpReceiver(host=c.gateway) as receiver:      # reachable from every host
            env = c.env(**receiver.env("grpc"), TF_OTEL_ENABLED="1")
            c.horovodrun("horovod_tape.py", env)            # -np 4 -H hostA:2,hostB:2 --gloo
            c.mpirun("horovod_tape.py", env)                # mpirun -H hostA:2,hostB:2
        c.host_ranks()                                      # {"hostA": [0, 1], "hostB": [2, 3]}

``skew_ns`` shifts the clock tf_otel reads on every rank of that host (TF_OTEL_TEST_CLOCK: the
spans then carry ``tf_otel.clock.test_error_ns``, the truth to compare against). ``slow_link``
rate-limits the host's link both ways (tc tbf), ``cpus`` pins the host's processes (taskset -c),
``cpu_hog`` runs that many busy loops pinned like the host; ``with c.slowed_link("hostB",
"50mbit"):`` slows a link for a block only. Everything is removed on exit, also when the body
fails.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Dict, Iterator, List, Mapping, Optional, Sequence

from conftest import EXAMPLES, REPO, VENV_BIN, base_env

sys.path.insert(0, str(REPO / "scripts" / "cluster"))
from netcluster import NetCluster  # noqa: E402

# what mpirun forwards to the ranks (-x): ssh starts remote shells with a clean environment
FORWARD_PREFIXES = ("TF_OTEL_", "OTEL_", "HOROVOD_", "TF_", "PYTHON", "STEPS", "SLOW_")
FORWARD = ("PATH", "LD_LIBRARY_PATH", "OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


class Cluster:
    def __init__(
        self,
        hosts: int = 2,
        slots: int = 2,
        skew_ns: Optional[Mapping[str, int]] = None,
        slow_link: Optional[Mapping[str, str]] = None,
        cpu_hog: Optional[Mapping[str, int]] = None,
        cpus: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.net = NetCluster(hosts, slots, slow_link, cpus, cpu_hog)
        self.slots = slots
        self.skew_ns = dict(skew_ns or {})
        for name in self.skew_ns:
            if name not in self.net.hosts:
                raise ValueError(f"unknown host {name!r}: expected one of {self.net.hosts}")

    def __enter__(self) -> Cluster:
        self.net.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.net.down()

    @property
    def hosts(self) -> List[str]:
        return self.net.hosts

    @property
    def gateway(self) -> str:
        """The machine's own address on the bridge: bind receivers/collectors here."""
        return self.net.address("gateway")

    def address(self, host: str) -> str:
        return self.net.address(host)

    @contextlib.contextmanager
    def slowed_link(self, host: str, rate: str) -> Iterator[None]:
        """The slow link of ``slow_link`` for the body only (tc tbf both ways, then removed):
        one cluster can run a control and a slowed-link run side by side."""
        veth = self.net._veth(self.net.members.index(host))
        inside = ["ip", "netns", "exec", self.net.netns(host)]
        tbf = ["root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
        subprocess.run(["tc", "qdisc", "add", "dev", veth, *tbf], check=True)  # towards the host
        try:
            subprocess.run([*inside, "tc", "qdisc", "add", "dev", "eth0", *tbf], check=True)
            yield
        finally:
            # what each tbf sent, dropped and held back: in the test's output for a failure
            for side in (
                ["tc", "-s", "qdisc", "show", "dev", veth],
                [*inside, "tc", "-s", "qdisc", "show", "dev", "eth0"],
            ):
                shown = subprocess.run(side, capture_output=True, text=True, check=False)
                print(f"slowed_link {host} {' '.join(side[-3:])}: {' '.join(shown.stdout.split())}")
            subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], check=False)
            subprocess.run([*inside, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)

    def np(self) -> int:
        return len(self.hosts) * self.slots

    def host_list(self) -> str:
        return ",".join(f"{h}:{self.slots}" for h in self.hosts)

    def host_ranks(self, np: Optional[int] = None) -> Dict[str, List[int]]:
        """Which ranks run where: both launchers fill hosts in -H order, slot by slot."""
        np = self.np() if np is None else np
        out: Dict[str, List[int]] = {}
        for rank in range(np):
            out.setdefault(self.hosts[rank // self.slots], []).append(rank)
        return out

    def env(self, **extra: str) -> Dict[str, str]:
        """base_env plus the per-host clock skews (as TF_OTEL_TEST_CLOCK entries per rank)."""
        env = base_env(**extra)
        entries = [e for e in env.get("TF_OTEL_TEST_CLOCK", "").split(",") if e.strip()]
        for host, skew in self.skew_ns.items():
            entries += [f"{rank}:{skew}:0" for rank in self.host_ranks().get(host, [])]
        if entries:
            env["TF_OTEL_TEST_CLOCK"] = ",".join(entries)
        return env

    def _script(self, script: str) -> str:
        return script if "/" in script else str(EXAMPLES / script)

    def horovodrun(
        self,
        script: str,
        env: Mapping[str, str],
        np: Optional[int] = None,
        args: Sequence[str] = (),
        backend: str = "gloo",
        timeout: float = 300,
        check: bool = True,
    ) -> subprocess.CompletedProcess:
        command = [
            str(VENV_BIN / "horovodrun"),
            *("-np", str(np or self.np()), "-H", self.host_list(), f"--{backend}"),
            str(VENV_BIN / "python"),
            self._script(script),
            *args,
        ]
        return self._launch(command, env, timeout, check)

    def mpirun(
        self,
        script: str,
        env: Mapping[str, str],
        np: Optional[int] = None,
        args: Sequence[str] = (),
        timeout: float = 300,
        check: bool = True,
    ) -> subprocess.CompletedProcess:
        forward = [k for k in env if k in FORWARD or k.startswith(FORWARD_PREFIXES)]
        command = [
            "mpirun",
            "--allow-run-as-root",
            *("-np", str(np or self.np()), "-H", self.host_list(), "--map-by", "slot"),
            *("--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0"),
            *[a for k in forward for a in ("-x", k)],
            str(VENV_BIN / "python"),
            self._script(script),
            *args,
        ]
        return self._launch(command, env, timeout, check)

    def _launch(
        self, command: List[str], env: Mapping[str, str], timeout: float, check: bool
    ) -> subprocess.CompletedProcess:
        result = self.net.launch(command, env, timeout=timeout, cwd=str(REPO))
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(command)} exited {result.returncode}\n--- stdout\n"
                f"{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-6000:]}"
            )
        return result
