"""Many hosts on one machine: network namespaces on a bridge, each with its own hostname and
Debian's sshd, so ``horovodrun -H hostA:2,hostB:2`` and ``mpirun -H ...`` run over ssh as on a
real cluster. Needs root (CAP_NET_ADMIN/SYS_ADMIN), iproute2, util-linux and openssh-server.

Layout (cluster id C, picked free at start, so several clusters can run side by side)::

    bridge tfoCbr 10.77.C.1/24        the machine itself (a collector/receiver may bind here)
    netns tfoC-login  eth0 10.77.C.2  hostname "login": where horovodrun/mpirun run
    netns tfoC-hostA  eth0 10.77.C.11 hostname "hostA", sshd on :22
    netns tfoC-hostB  eth0 10.77.C.12 ...

No default route: nothing leaves the bridge. Names resolve through a hosts file bind-mounted
over /etc/hosts in private mount namespaces (the machine's /etc/hosts is never edited) and an
ssh config used by an ``ssh`` wrapper put first on the launcher's PATH. Keys are made per run in
a temp dir. Faults: ``slow_link`` (tc tbf both ways on the host's veth), ``cpus`` (the host's
sshd, hence its ranks, pinned with taskset) and ``cpu_hog`` (busy loops pinned like the host).

Usage::

    python scripts/cluster/netcluster.py up --hosts 2 [--slow hostB=20mbit] [--cpus hostB=1]
                                            [--hog hostB=1]   # prints the state file
    python scripts/cluster/netcluster.py status | down        # down is idempotent
    python scripts/cluster/netcluster.py exec [--host login] -- horovodrun -np 4 \
        -H hostA:2,hostB:2 --gloo .venv/bin/python train.py

    with NetCluster(hosts=2) as cluster:           # from Python
        cluster.launch(["horovodrun", ...], env)   # runs in the login namespace
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

PREFIX = "tfo"
STATE_LINK = Path(tempfile.gettempdir()) / "tf_otel_cluster.json"  # the CLI's current cluster
LAUNCHER = "login"
SSHD = "/usr/sbin/sshd"


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(list(args), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result


def host_names(n: int) -> List[str]:
    return [f"host{chr(ord('A') + i)}" for i in range(n)]


class NetCluster:
    """The namespaces, bridge, sshds and faults of one simulated cluster."""

    def __init__(
        self,
        hosts: int = 2,
        slots: int = 2,
        slow_link: Optional[Mapping[str, str]] = None,
        cpus: Optional[Mapping[str, str]] = None,
        cpu_hog: Optional[Mapping[str, int]] = None,
    ) -> None:
        if not 1 <= hosts <= 26:
            raise ValueError(f"hosts={hosts!r}: expected 1..26")
        self.hosts = host_names(hosts)
        self.slots = slots
        self.slow_link = dict(slow_link or {})
        self.cpus = dict(cpus or {})
        self.cpu_hog = dict(cpu_hog or {})
        for option in (self.slow_link, self.cpus, self.cpu_hog):
            for name in option:
                if name not in self.hosts:
                    raise ValueError(f"unknown host {name!r}: expected one of {self.hosts}")
        self.cid = 0
        self.workdir = ""
        self.pids: List[int] = []  # sshds and hogs we started

    # -- names ------------------------------------------------------------------------------
    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.cid}br"

    def netns(self, name: str) -> str:
        return f"{PREFIX}{self.cid}-{name}"

    def address(self, name: str) -> str:
        """The bridge address of a host, of ``login``, or of ``gateway`` (the machine)."""
        if name == "gateway":
            return f"10.77.{self.cid}.1"
        if name == LAUNCHER:
            return f"10.77.{self.cid}.2"
        return f"10.77.{self.cid}.{11 + self.hosts.index(name)}"

    def _veth(self, index: int) -> str:
        return f"{PREFIX}{self.cid}v{index}"

    @property
    def members(self) -> List[str]:
        return [LAUNCHER, *self.hosts]

    @property
    def bin_dir(self) -> str:
        """Put first on the launcher's PATH: an ``ssh`` that knows the cluster's hosts."""
        return os.path.join(self.workdir, "bin")

    # -- life cycle -------------------------------------------------------------------------
    def up(self) -> NetCluster:
        if os.geteuid() != 0:
            raise RuntimeError("the simulated cluster needs root (network namespaces)")
        if not os.path.exists(SSHD):
            raise RuntimeError(f"{SSHD} missing: apt-get install openssh-server")
        self.workdir = tempfile.mkdtemp(prefix="tf_otel_cluster_")
        try:
            self._claim_bridge()
            self._write_files()
            self._make_hosts()
            self._apply_faults()
            self._start_sshds()
            self._wait_sshds()
        except BaseException:
            self.down()
            raise
        self.save()
        return self

    def _claim_bridge(self) -> None:
        # creating the bridge is atomic: "File exists" means another cluster holds this id
        for cid in random.sample(range(1, 250), 248):
            self.cid = cid
            if _sh("ip", "link", "add", self.bridge, "type", "bridge", check=False).returncode:
                continue
            if _sh("ip", "netns", "list", check=False).stdout.count(f"{PREFIX}{cid}-"):
                _sh("ip", "link", "del", self.bridge, check=False)
                continue
            _sh("ip", "addr", "add", f"{self.address('gateway')}/24", "dev", self.bridge)
            _sh("ip", "link", "set", self.bridge, "up")
            return
        raise RuntimeError("no free cluster id")

    def _write_files(self) -> None:
        work = Path(self.workdir)
        (work / "bin").mkdir()
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "host_key"))
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "id_ed25519"))
        shutil.copy(work / "id_ed25519.pub", work / "authorized_keys")
        lines = ["127.0.0.1 localhost"] + [f"{self.address(m)} {m}" for m in self.members]
        (work / "hosts").write_text("\n".join(lines) + "\n")
        config = []
        for name in self.hosts:
            config += [f"Host {name}", f"  HostName {self.address(name)}"]
        config += [
            "Host *",
            "  User root",
            f"  IdentityFile {work / 'id_ed25519'}",
            "  IdentitiesOnly yes",
            "  StrictHostKeyChecking no",
            "  UserKnownHostsFile /dev/null",
            "  LogLevel ERROR",
            "  BatchMode yes",
            "  ConnectTimeout 10",
        ]
        (work / "ssh_config").write_text("\n".join(config) + "\n")
        wrapper = work / "bin" / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {work / "ssh_config"} "$@"\n')
        wrapper.chmod(0o755)
        for name in self.hosts:
            (work / f"sshd_{name}.conf").write_text(
                "\n".join(
                    [
                        f"ListenAddress {self.address(name)}",
                        "Port 22",
                        f"HostKey {work / 'host_key'}",
                        f"PidFile {work / f'sshd_{name}.pid'}",
                        f"AuthorizedKeysFile {work / 'authorized_keys'}",
                        "PermitRootLogin prohibit-password",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "UsePAM no",
                        "StrictModes no",
                        "PrintMotd no",
                        "MaxStartups 200",
                        "MaxSessions 200",
                        "LogLevel ERROR",
                        f"SetEnv TF_OTEL_CLUSTER_HOST={name}",
                    ]
                )
                + "\n"
            )

    def _make_hosts(self) -> None:
        for index, name in enumerate(self.members):
            ns, veth = self.netns(name), self._veth(index)
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _sh("ip", "link", "set", veth, "master", self.bridge)
            _sh("ip", "link", "set", veth, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "-n", ns, "addr", "add", f"{self.address(name)}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")

    def _apply_faults(self) -> None:
        for name, rate in self.slow_link.items():
            veth = self._veth(self.members.index(name))
            tbf = ["root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
            _sh("tc", "qdisc", "add", "dev", veth, *tbf)  # towards the host
            _sh("ip", "netns", "exec", self.netns(name), "tc", "qdisc", "add", "dev", "eth0", *tbf)
        for name, n in self.cpu_hog.items():
            for _ in range(int(n)):
                command = [*self._pin(name), "sh", "-c", "while :; do :; done"]
                self.pids.append(self._spawn(name, command, os.devnull))

    def _pin(self, name: str) -> List[str]:
        return ["taskset", "-c", self.cpus[name]] if name in self.cpus else []

    def _spawn(self, name: str, command: Sequence[str], log: str) -> int:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.netns(name), *command],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        return proc.pid

    def _private(self, name: str) -> List[str]:
        """A private mount + UTS namespace: own hostname, the cluster's hosts file."""
        script = 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"'
        hosts = os.path.join(self.workdir, "hosts")
        return ["unshare", "-m", "-u", "sh", "-c", script, hosts, name]

    def _start_sshds(self) -> None:
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        for name in self.hosts:
            conf = os.path.join(self.workdir, f"sshd_{name}.conf")
            log = os.path.join(self.workdir, f"sshd_{name}.log")
            command = [*self._pin(name), *self._private(name), SSHD, "-D", "-e", "-f", conf]
            self.pids.append(self._spawn(name, command, log))

    def _wait_sshds(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        for name in self.hosts:
            while True:
                try:
                    socket.create_connection((self.address(name), 22), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        log = Path(self.workdir, f"sshd_{name}.log").read_text()[-2000:]
                        raise RuntimeError(f"sshd on {name} did not start:\n{log}") from None
                    time.sleep(0.05)

    def down(self) -> None:
        """Remove everything this cluster made; safe to call twice or after a failed ``up``."""
        if not self.cid:
            return
        for pid in self.pids:
            _kill(pid)
        for name in self.members:  # ranks and daemons still inside (all started by us)
            out = _sh("ip", "netns", "pids", self.netns(name), check=False).stdout
            for pid in out.split():
                _kill(int(pid))
        for index, _ in enumerate(self.members):
            _sh("ip", "link", "del", self._veth(index), check=False)
        for name in self.members:
            _sh("ip", "netns", "del", self.netns(name), check=False)
        _sh("ip", "link", "del", self.bridge, check=False)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.pids = []

    def __enter__(self) -> NetCluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- use --------------------------------------------------------------------------------
    def prefix(self, name: str = LAUNCHER) -> List[str]:
        """The argv prefix that runs a command inside ``name`` (own hostname, hosts file)."""
        return ["ip", "netns", "exec", self.netns(name), *self._pin(name), *self._private(name)]

    def launch_env(self, env: Mapping[str, str]) -> Dict[str, str]:
        out = dict(env)
        out["PATH"] = self.bin_dir + os.pathsep + out.get("PATH", os.environ.get("PATH", ""))
        return out

    def launch(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        host: str = LAUNCHER,
        timeout: float = 300,
        cwd: Optional[str] = None,
    ) -> subprocess.CompletedProcess:
        """Run ``command`` in ``host`` (the login namespace by default), output captured."""
        return subprocess.run(
            [*self.prefix(host), *command],
            env=self.launch_env(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def status(self) -> Dict[str, object]:
        alive = [pid for pid in self.pids if _alive(pid)]
        namespaces = _sh("ip", "netns", "list", check=False).stdout
        return {
            "cid": self.cid,
            "workdir": self.workdir,
            "bridge": self.bridge,
            "hosts": {n: self.address(n) for n in self.members},
            "namespaces": [self.netns(n) for n in self.members if self.netns(n) in namespaces],
            "processes_alive": alive,
            "ssh": os.path.join(self.bin_dir, "ssh"),
        }

    # -- CLI state ----------------------------------------------------------------------------
    def save(self) -> None:
        state = {k: getattr(self, k) for k in ("hosts", "slots", "slow_link", "cpus", "cpu_hog")}
        state.update(cid=self.cid, workdir=self.workdir, pids=self.pids)
        Path(self.workdir, "state.json").write_text(json.dumps(state))

    @classmethod
    def load(cls, path: Path) -> NetCluster:
        state = json.loads(path.read_text())
        cluster = cls(len(state["hosts"]), state["slots"], state["slow_link"], state["cpus"])
        cluster.cpu_hog = state["cpu_hog"]
        cluster.cid, cluster.workdir, cluster.pids = state["cid"], state["workdir"], state["pids"]
        return cluster


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _kill(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except OSError:
            return
        for _ in range(20):
            if not _alive(pid):
                return
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.05)


def _pairs(items: Sequence[str]) -> Dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected HOST=VALUE, got {item!r}")
        out[name] = value
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down", "status", "exec"])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--slow", action="append", default=[], help="HOST=RATE, e.g. hostB=20mbit")
    parser.add_argument("--cpus", action="append", default=[], help="HOST=CPULIST (taskset -c)")
    parser.add_argument("--hog", action="append", default=[], help="HOST=N busy loops")
    parser.add_argument("--host", default=LAUNCHER, help="exec: where to run (default login)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    current = STATE_LINK.exists() and Path(STATE_LINK.read_text().strip())
    if args.action == "up":
        if current and current.exists():
            print(f"a cluster is up already ({current}); run down first", file=sys.stderr)
            return 1
        hog = {k: int(v) for k, v in _pairs(args.hog).items()}
        cluster = NetCluster(args.hosts, args.slots, _pairs(args.slow), _pairs(args.cpus), hog)
        cluster.up()
        STATE_LINK.write_text(str(Path(cluster.workdir, "state.json")))
        print(json.dumps(cluster.status(), indent=1))
        print(
            f"use: {sys.argv[0]} exec -- horovodrun -np {args.hosts * args.slots} -H "
            + ",".join(f"{h}:{args.slots}" for h in cluster.hosts)
            + " --gloo python ..."
        )
        return 0
    if not current or not current.exists():
        if args.action == "down":
            STATE_LINK.unlink(missing_ok=True)
            return 0  # nothing up: down is idempotent
        print("no cluster is up (make cluster)", file=sys.stderr)
        return 1
    cluster = NetCluster.load(current)
    if args.action == "down":
        cluster.down()
        STATE_LINK.unlink(missing_ok=True)
        return 0
    if args.action == "status":
        print(json.dumps(cluster.status(), indent=1))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    env = cluster.launch_env(os.environ)
    return subprocess.call([*cluster.prefix(args.host), *command], env=env)


if __name__ == "__main__":
    sys.exit(main())
