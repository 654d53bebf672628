"""tests/ports.py: the ports tests give servers up front come from outside the kernel's ephemeral
range, from a block of their own per process, each free when picked; a taken one is skipped; a
cluster start is started again with new ports when, and only when, a server's own output names
one of its ports as the one it could not bind."""

from __future__ import annotations

import os
import socket
import sys
import textwrap
from typing import List

import ports
import pytest
from conftest import base_env
from ports import PortTaken, Tasks, bind_failure, free_port_pair, free_ports, with_new_ports

from tf_otel.job.topology import COORDINATOR_BASE_PORT, COORDINATOR_PORT_SPAN


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
            return True
        except OSError:
            return False


def test_ports_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    low, high = ports.ephemeral_range()
    pairs = [free_port_pair() for _ in range(5)]
    picked = free_ports(20) + pairs + [p + 1 for p in pairs]
    assert len(set(picked)) == len(picked), picked
    for port in picked:
        assert ports.FLOOR <= port <= 65535 and not low <= port <= high, (port, low, high)
        assert port not in ports.DERIVED, port
        assert _bindable(port), port  # released, and free


def test_derived_coordinator_ports_are_the_products() -> None:
    # a job on this machine without TF_OTEL_COORDINATOR binds one of these (and the next one)
    last = COORDINATOR_BASE_PORT + 2 * (COORDINATOR_PORT_SPAN - 1) + 1
    assert ports.DERIVED == range(COORDINATOR_BASE_PORT, last + 1)


def test_each_process_walks_a_block_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    count = len(ports.candidates())
    block = count // ports.SLOTS
    starts = [ports.walk_start(pid, count) for pid in range(4000, 4000 + ports.SLOTS)]
    assert sorted(starts) == [n * block for n in range(ports.SLOTS)]
    # a walk left by another pid (a forked child's copy) begins again at this process's block
    monkeypatch.setattr(ports, "_walk", {"pid": -1, "next": 0})
    (port,) = free_ports(1)
    first = ports.walk_start(os.getpid(), count)
    assert first <= ports.candidates().index(port) < first + block, port


def test_a_taken_port_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    candidates = ports.candidates()
    (port,) = free_ports(1)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))  # taken on one address: taken for a server on all
        squatter.listen()
        monkeypatch.setattr(ports, "_walk", {"pid": os.getpid(), "next": candidates.index(port)})
        (other,) = free_ports(1)
        assert other != port and other in candidates
        # a pair whose p + 1 is taken is skipped as a whole
        monkeypatch.setattr(
            ports, "_walk", {"pid": os.getpid(), "next": candidates.index(port) - 1}
        )
        pair = free_port_pair()
        assert port not in (pair, pair + 1), (port, pair)


def test_a_refused_port_refuses_and_cannot_be_taken() -> None:
    with ports.refused_port() as port:
        for target in (port, port + 1):  # p + 1: a coordinator's clock service
            with socket.socket() as client:
                assert client.connect_ex(("127.0.0.1", target)) != 0
            assert not _bindable(target)
    assert _bindable(port)


TF_LINE = (
    "E0000 00:00:1795768136.880804    4284 add_port.cc:83] Failed to add port to server: "
    "No address added out of total 1 resolved for '0.0.0.0:{port}'"
)
COORDINATOR_LINE = (
    "tf_otel: cannot listen on 127.0.0.1:{port} ([Errno 98] error while attempting to bind on "
    "address ('127.0.0.1', {port}): address already in use); step roots will cover rank 0 only."
)
CLOCK_LINE = (
    "[1,0]<stderr>:tf_otel: clock service cannot listen on port {port} ([Errno 98] Address "
    "already in use); clocks stay uncorrected"
)


@pytest.mark.parametrize("line", [TF_LINE, COORDINATOR_LINE, CLOCK_LINE])
def test_a_bind_failure_is_one_naming_our_port(line: str) -> None:
    text = "starting\n" + line.format(port=36025) + "\nTraceback (most recent call last):\n"
    assert bind_failure(text, [1234, 36025]) == 36025
    assert bind_failure(text, [1234]) is None  # someone else's port: not ours to retry


@pytest.mark.parametrize(
    "line",
    [
        "E0000 grpc_server_lib.cc:618] UNKNOWN: Could not start gRPC server",  # no port named
        "tensorflow.python.framework.errors_impl.UnknownError: Could not start gRPC server",
        "tf_otel: cannot listen on 127.0.0.1:36025 ([Errno 13] Permission denied)",
        "tf_otel: host relay cannot listen ([Errno 98] Address already in use); ranks go direct",
        "worker 0 done steps=36025",
    ],
)
def test_other_failures_are_not_bind_failures(line: str) -> None:
    assert bind_failure(line, [36025]) is None


# A server as tf_otel's coordinator serves (the real one, the real message when it cannot
# listen); like a job it goes on when it cannot, so the start must be seen failing from its
# output, not from its end.
SERVER = textwrap.dedent(
    """
    import sys, time
    from tf_otel.cluster.coordinator import StepAggregator
    ok = StepAggregator(2, 1.0, lambda *args: None).serve(("127.0.0.1", int(sys.argv[1])))
    print("serving" if ok else "not serving", flush=True)
    time.sleep(0 if ok else 60)
    """
)


def _serve(port: int) -> List[str]:
    with Tasks([port]) as tasks:
        tasks.start([sys.executable, "-c", SERVER, str(port)], base_env())
        return tasks.wait([0], timeout=60)


def test_a_start_that_meets_a_taken_port_starts_again_with_new_ports() -> None:
    tried: List[int] = []
    with socket.socket() as squatter:

        def start() -> List[str]:
            port = free_port_pair()
            tried.append(port)
            if len(tried) == 1:  # another process takes it between the pick and the bind
                squatter.bind(("127.0.0.1", port))
                squatter.listen()
            return _serve(port)

        outputs = with_new_ports(start)
    assert len(tried) == 2 and tried[0] != tried[1], tried
    assert outputs[0].strip().endswith("serving") and "not serving" not in outputs[0], outputs


def test_a_port_taken_on_every_start_fails_with_a_clear_message() -> None:
    squatters: List[socket.socket] = []

    def start() -> List[str]:
        port = free_port_pair()
        squatters.append(socket.socket())
        squatters[-1].bind(("127.0.0.1", port))
        squatters[-1].listen()
        return _serve(port)

    try:
        with pytest.raises(PortTaken, match=r"port \d+ was taken .*start 2 of 2"):
            with_new_ports(start, attempts=2)
    finally:
        for sock in squatters:
            sock.close()
    assert len(squatters) == 2


def test_any_other_failure_is_not_started_again() -> None:
    calls: List[int] = []

    def start() -> List[str]:
        calls.append(1)
        (port,) = free_ports(1)
        with Tasks([port]) as tasks:
            code = "print('UnknownError: Could not start gRPC server'); raise SystemExit(1)"
            tasks.start([sys.executable, "-c", code], base_env())
            return tasks.wait([0], timeout=60)

    outputs = with_new_ports(start)
    assert calls == [1]  # the test then fails on what it got, as it would have without retries
    assert "Could not start gRPC server" in outputs[0]


@pytest.mark.integration
def test_a_tf_server_on_a_taken_port_is_a_port_taken() -> None:
    """The installed TensorFlow still says which port it could not bind, in the words
    ports.BIND_FAILED looks for (the Server is what every cluster test starts)."""
    pytest.importorskip("tensorflow")
    script = (
        "import sys, tensorflow as tf\n"
        "spec = tf.train.ClusterSpec({'ps': ['127.0.0.1:' + sys.argv[1]]})\n"
        "tf.distribute.Server(spec, job_name='ps', task_index=0)\n"
        "print('serving', flush=True)\n"
    )
    with socket.socket() as squatter:
        (port,) = free_ports(1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with Tasks([port]) as tasks:
            tasks.start([sys.executable, "-c", script, str(port)], base_env())
            with pytest.raises(PortTaken, match=f"port {port} was taken"):
                tasks.wait([0], timeout=240)
