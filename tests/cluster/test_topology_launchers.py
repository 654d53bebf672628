"""Rank 0's host and the job id from each launcher's environment, as two hosts see them: the
variables are the ones horovodrun, mpirun (Open MPI 4.1), srun and TF_CONFIG give ranks (taken
from real runs on the simulated cluster, tests/cluster/sim.py). Horovod's lookup runs against
Horovod's own rendezvous server."""

from __future__ import annotations

import json

import pytest
from horovod.runner.http.http_server import RendezvousServer

from tf_otel.clock.sync import clock_address
from tf_otel.config import Settings
from tf_otel.job import topology
from tf_otel.otel.ids import step_trace_id


def horovod_env(rank: int, port: str = "19175") -> dict:
    host = "hostA" if rank < 2 else "hostB"
    return {
        "HOROVOD_HOSTNAME": host,
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": "4",
        "HOROVOD_LOCAL_RANK": str(rank % 2),
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": str(rank // 2),
        "HOROVOD_CROSS_SIZE": "2",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",  # the launcher's host, not rank 0's
        "HOROVOD_GLOO_RENDEZVOUS_PORT": port,
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_GLOO_IFACE": "eth0",
    }


def ompi_env(rank: int, regex: str = "login,hostA,hostB@0(3)", nodes: str = "2") -> dict:
    host = "hostA" if rank < 2 else "hostB"
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % 2),
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "OMPI_MCA_ess_base_jobid": "1306066945",
        "OMPI_MCA_orte_hnp_uri": "1306066944.0;tcp://10.77.191.2:45933",
        "OMPI_MCA_orte_node_regex": regex,
        "OMPI_MCA_orte_num_nodes": nodes,
        "PMIX_NAMESPACE": "1306066945",
        "PMIX_RANK": str(rank),
        "PMIX_HOSTNAME": host,
        "PMIX_SERVER_URI41": f"1306066944.{1 + rank // 2};tcp4://127.0.0.1:37501",
    }


def slurm_env(rank: int) -> dict:
    return {
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": str(rank % 2),
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.1",
    }


def _same_job(envs):
    topos = [topology.detect(env) for env in envs]
    job_ids = {t.job_id for t in topos}
    assert len(job_ids) == 1 and "unknown" not in job_ids
    assert len({step_trace_id(t.job_id, "train_step", 7) for t in topos}) == 1
    assert len({t.coordinator_address()[1] for t in topos if t.rank}) == 1
    return topos


def test_horovod_multi_host_finds_rank0_through_the_rendezvous_store():
    server = RendezvousServer()
    port = server.start()
    try:
        envs = [horovod_env(rank, str(port)) for rank in range(4)]
        rank0, _, rank2, rank3 = _same_job(envs)
        address = rank2.coordinator_address()
        assert address[0].startswith(topology.KV_SCHEME)
        assert "127.0.0.1" not in address[0].split("/")[-1]
        with pytest.raises(OSError, match="not published"):
            topology.resolve_address(address)  # rank 0 has not started yet: callers retry
        rank0_address = rank0.coordinator_address()  # rank 0 publishes, in the background
        topology.publish_reference(rank0_address[0]).join(10)
        host, got_port = topology.resolve_address(rank3.coordinator_address())
        assert (host, got_port) == ("127.0.0.1", address[1]) == ("127.0.0.1", rank0_address[1])
    finally:
        server.stop()


def test_horovod_store_unreachable_is_an_oserror_not_a_crash():
    env = horovod_env(1, "1")  # nothing listens on port 1
    topo = topology.detect(env)
    with pytest.raises(OSError):
        topology.resolve_address(topo.coordinator_address())


def test_horovod_single_host_stays_on_loopback():
    env = {**horovod_env(1), "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_SIZE": "2"}
    assert topology.detect(env).reference_host == "127.0.0.1"


@pytest.mark.parametrize(
    "regex,nodes,rank0_host",
    [
        ("login,hostA,hostB@0(3)", "2", "hostA"),  # mpirun on a login node holding no rank
        ("hostA,hostB@0(2)", "2", "hostA"),  # mpirun on the first node
        ("login,gpu[2:7-8]@0(3)", "2", "gpu07"),
        ("node[3:1-2,5]@0(3)", "3", "node001"),
    ],
)
def test_open_mpi_rank0_is_the_first_node_holding_ranks(regex, nodes, rank0_host):
    topos = _same_job([ompi_env(rank, regex, nodes) for rank in range(4)])
    assert {t.reference_host for t in topos} == {rank0_host}
    assert {t.launcher for t in topos} == {"openmpi"}


def test_ompi_nodes_bad_regex_gives_no_host():
    assert topology.ompi_nodes("node[3:x-2]@0(2)") == []


def test_slurm_rank0_is_the_first_node_of_the_step():
    topos = _same_job([slurm_env(rank) for rank in range(4)])
    assert {t.reference_host for t in topos} == {"gpu07"}


def test_tf_config_rank0_is_the_chief():
    cluster = {"chief": ["hostA:2222"], "worker": ["hostA:2223", "hostB:2222", "hostB:2223"]}
    envs = []
    for kind, index in (("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2)):
        task = {"type": kind, "index": index}
        envs.append({"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})})
    topos = _same_job(envs)
    assert {t.reference_host for t in topos} == {"hostA"}
    assert [t.rank for t in topos] == [0, 1, 2, 3]


def test_tf_otel_coordinator_overrides_every_launcher():
    settings = Settings.from_env({"TF_OTEL_COORDINATOR": "10.1.2.3:5000"})
    for env in (horovod_env(2), ompi_env(2), slurm_env(2)):
        assert clock_address(topology.detect(env), settings) == ("10.1.2.3", 5001)
