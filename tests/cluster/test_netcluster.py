"""The simulated cluster itself: hosts reached by name over ssh with their own hostnames, faults
in place on the faulty host only, and nothing left behind by ``down`` (twice, and after a failure
inside the ``with``)."""

from __future__ import annotations

import subprocess

import pytest
from sim import Cluster


def _netns() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def test_hosts_over_ssh_faults_and_cleanup():
    cluster = Cluster(hosts=2, slots=1, slow_link={"hostB": "10mbit"}, cpu_hog={"hostB": 1})
    with pytest.raises(RuntimeError, match="boom"):
        with cluster as c:
            net = c.net
            result = net.launch(
                ["sh", "-c", "hostname; ssh hostA hostname; ssh hostB 'hostname; ip -o -4 addr'"],
                c.env(),
            )
            assert result.returncode == 0, result.stderr
            lines = result.stdout.splitlines()
            assert lines[:3] == ["login", "hostA", "hostB"]
            assert f"{c.address('hostB')}/24" in result.stdout
            assert "127.0.0.1" not in c.address("hostB")
            qdisc = subprocess.run(
                ["tc", "qdisc", "show", "dev", net._veth(2)], capture_output=True, text=True
            ).stdout
            assert "tbf" in qdisc and "10Mbit" in qdisc
            clean = subprocess.run(
                ["tc", "qdisc", "show", "dev", net._veth(1)], capture_output=True, text=True
            ).stdout
            assert "tbf" not in clean
            hogs = subprocess.run(
                ["ip", "netns", "pids", net.netns("hostB")], capture_output=True, text=True
            ).stdout.split()
            assert len(hogs) >= 2  # sshd and the busy loop
            prefix = f"tfo{net.cid}"
            assert prefix + "-hostA" in _netns()
            raise RuntimeError("boom")  # a failing test body: everything must still go
    assert prefix not in _netns()
    assert prefix not in _links()
    assert not any(
        subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode == 0
        for pid in [int(p) for p in hogs]
    )
    net.down()  # idempotent
