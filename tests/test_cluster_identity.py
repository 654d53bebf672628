"""Job identity from the cluster the program gives its own ``tf.distribute.Server`` (issue 25,
point 2): the same cluster gives the same topology as TF_CONFIG; the launcher's environment and
TF_CONFIG win; the pipeline takes the identity before its first step and keeps its own after.
No TensorFlow here except the last test (a real Server, one process)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tf_otel import config, record
from tf_otel.config import Settings
from tf_otel.job import topology
from tf_otel.runtime import lifecycle

CLUSTER = {
    "ps": ["127.0.0.1:2222"],
    "worker": ["127.0.0.1:2223", "127.0.0.1:2224"],
}
TASKS = (("worker", 0), ("worker", 1), ("ps", 0))


def tf_config_topology(cluster, task_type, index):
    task = {"type": task_type, "index": index}
    return topology.detect({"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})})


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """No launcher or TF_CONFIG in os.environ, no learned cluster, no pipeline; an in-memory
    tracer provider for a pipeline created here. Everything restored afterwards."""
    for name in list(os.environ):
        if name == "TF_CONFIG" or name.startswith(
            ("HOROVOD_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "TF_OTEL_")
        ):
            monkeypatch.delenv(name)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(lifecycle, "_pipeline", None)
    monkeypatch.setattr(lifecycle, "_setups", [])
    monkeypatch.setattr(lifecycle, "_tracer_provider", provider)
    monkeypatch.setattr(lifecycle, "_in_process_cluster", False)
    monkeypatch.setattr(topology, "_program", None)
    monkeypatch.setattr(config, "_current", Settings(root_wait_ms=100))
    yield exporter
    pipeline = lifecycle._pipeline
    if pipeline is not None:
        pipeline.shutdown(1.0)


# -- the cluster -> topology mapping ----------------------------------------------------------


@pytest.mark.parametrize("task_type,index", TASKS)
def test_program_cluster_gives_the_tf_config_topology(task_type: str, index: int) -> None:
    from_tf_config = tf_config_topology(CLUSTER, task_type, index)
    # as a ClusterDef holds it (task index -> address), as a ClusterSpec's dict holds it
    for cluster in (CLUSTER, {job: dict(enumerate(tasks)) for job, tasks in CLUSTER.items()}):
        found = topology.program_cluster(cluster, task_type, index)
        assert found is not None
        from_program = found.topology(from_tf_config.host)
        assert from_program.launcher == topology.TF_SERVER == "tf_server"
        assert dataclasses.replace(from_program, launcher="tf_config") == from_tf_config


def test_cluster_ranks_world_size_roles_and_one_job_id() -> None:
    topos = [topology.program_cluster(CLUSTER, *t).topology("h") for t in TASKS]  # type: ignore
    assert [t.rank for t in topos] == [0, 1, 2]  # worker 0 first, the ps last
    assert {t.world_size for t in topos} == {3}  # the ps is a member
    assert {t.step_world_size for t in topos} == {2}  # ... that runs no steps
    assert [t.task for t in topos] == ["worker:0", "worker:1", "ps:0"]
    assert len({t.job_id for t in topos}) == 1
    assert {t.reference_host for t in topos} == {"127.0.0.1"}
    assert {t.coordinator_address() for t in topos} == {topos[0].coordinator_address()}
    # the job id is the cluster's: job and task order of the spec do not matter, addresses do
    shuffled = {"worker": list(CLUSTER["worker"]), "ps": list(CLUSTER["ps"])}
    assert topology.program_cluster(shuffled, "ps", 0).topology("h").job_id == topos[0].job_id  # type: ignore
    other = {**CLUSTER, "ps": ["127.0.0.1:9999"]}
    assert topology.program_cluster(other, "ps", 0).topology("h").job_id != topos[0].job_id  # type: ignore


def test_chief_is_rank_0_and_hosts_the_coordinator() -> None:
    cluster = {
        "worker": ["hostB:1", "hostC:1"],
        "ps": ["hostD:1"],
        "chief": ["hostA:1"],
    }
    found = topology.program_cluster(cluster, "chief", 0)
    assert found is not None
    chief = found.topology("hostA")
    worker = topology.program_cluster(cluster, "worker", 1).topology("hostC")  # type: ignore
    assert (chief.rank, worker.rank, chief.world_size, chief.stepping_ranks) == (0, 2, 4, 3)
    assert chief.reference_host == worker.reference_host == "hostA"
    expected = dataclasses.replace(tf_config_topology(cluster, "worker", 1), host="hostC")
    assert dataclasses.replace(worker, launcher="tf_config") == expected


def test_sparse_jobs_keep_their_task_indices() -> None:
    cluster = {"worker": {0: "a:1", 3: "b:1"}, "ps": {0: "c:1"}}
    assert topology.normalise_cluster(cluster) == {
        "worker": {"0": "a:1", "3": "b:1"},
        "ps": ["c:1"],
    }
    found = topology.program_cluster(cluster, "worker", 3)
    assert found is not None
    assert (found.topology("b").rank, found.topology("b").task) == (1, "worker:3")


def test_clusters_that_are_no_identity(caplog: pytest.LogCaptureFixture) -> None:
    assert topology.program_cluster({"localhost": ["localhost:0"]}, "localhost", 0) is None
    with caplog.at_level(logging.WARNING, logger="tf_otel"):
        assert topology.program_cluster(CLUSTER, "worker", 5) is None
        assert topology.program_cluster({"worker": 3}, "worker", 0) is None  # type: ignore
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "worker:5" in said and "ignoring the Server's cluster" in said


# -- precedence ---------------------------------------------------------------------------


def test_environment_wins_over_the_program_cluster(
    clean: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert lifecycle.learn_cluster(CLUSTER, "worker", 1)
    learned = topology.detect()
    assert (learned.launcher, learned.rank, learned.world_size) == ("tf_server", 1, 3)
    # an explicit environment (tests, tools) is that environment only
    assert topology.detect({}).launcher == "none"
    # TF_OTEL_JOB_ID: the job id only
    with_id = topology.detect(job_id="mine")
    assert (with_id.job_id, with_id.rank, with_id.launcher) == ("mine", 1, "tf_server")
    # TF_CONFIG wins (it is where such a program usually reads its cluster from)
    other = {"worker": ["h:1", "h:2", "h:3"]}
    task = {"type": "worker", "index": 2}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": other, "task": task}))
    assert (topology.detect().launcher, topology.detect().rank) == ("tf_config", 2)
    monkeypatch.delenv("TF_CONFIG")
    # so does a launcher
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    assert (topology.detect().launcher, topology.detect().rank) == ("slurm", 3)


# -- the pipeline takes it before the first step, keeps its own after ---------------------


def test_the_pipeline_is_created_with_the_learned_identity(clean: InMemorySpanExporter) -> None:
    assert lifecycle.learn_cluster(CLUSTER, "ps", 0)
    assert not lifecycle.learn_cluster(CLUSTER, "ps", 0)  # the same task again: no change
    pipeline = lifecycle.get_pipeline()
    expected = topology.program_cluster(CLUSTER, "ps", 0).topology(pipeline.topology.host)  # type: ignore
    assert pipeline.topology == expected and pipeline.job_id == expected.job_id


def test_a_pipeline_without_steps_is_reidentified(clean: InMemorySpanExporter) -> None:
    pipeline = lifecycle.get_pipeline()  # e.g. an on-demand request before the first step
    assert pipeline.topology.launcher == "none"
    assert lifecycle.learn_cluster(CLUSTER, "worker", 1)
    assert (pipeline.topology.rank, pipeline.topology.world_size) == (1, 3)
    resource = lifecycle._tracer_provider.resource.attributes
    assert resource[record.ATTR_RANK] == 1 and resource[record.ATTR_WORLD_SIZE] == 3
    assert resource[record.ATTR_JOB_ID] == pipeline.job_id
    assert resource[record.ATTR_LAUNCHER] == "tf_server"


def test_after_the_first_step_the_identity_is_kept(
    clean: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline = lifecycle.get_pipeline()
    handle = pipeline.begin_step("k", "step", record.SESSION_RUN)
    pipeline.end_step(handle)
    before = pipeline.topology
    with caplog.at_level(logging.WARNING, logger="tf_otel"):
        assert not lifecycle.learn_cluster(CLUSTER, "worker", 1)
    assert pipeline.topology == before and topology.learned_cluster() is None
    assert topology.detect().launcher == "none"  # every part of the process keeps one identity
    assert any("after its first traced step" in r.getMessage() for r in caplog.records)


def test_servers_of_several_tasks_in_one_process_are_no_identity(
    clean: InMemorySpanExporter,
) -> None:
    assert lifecycle.learn_cluster(CLUSTER, "worker", 0)
    assert lifecycle.learn_cluster(CLUSTER, "worker", 1)  # an in-process cluster: forgotten
    assert not lifecycle.learn_cluster(CLUSTER, "ps", 0)
    assert topology.learned_cluster() is None and topology.detect().launcher == "none"


def test_a_real_server_is_learned(clean: InMemorySpanExporter, capfd) -> None:
    """tf.compat.v1.train.Server (= tf.distribute.Server) built from a ClusterSpec, as flags
    give it; a single-task local server is no identity."""
    tf = pytest.importorskip("tensorflow")
    from ports import PortTaken, bind_failure, free_ports, with_new_ports

    from tf_otel.instrument import _patching
    from tf_otel.instrument import cluster as cluster_patch

    def server() -> dict:  # its cluster; again with new ports if its own was taken
        ps, w0, w1 = free_ports(3)  # a Server binds its own task's port (w1), start=False too
        spec = {"ps": [f"127.0.0.1:{ps}"], "worker": [f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"]}
        try:
            tf.compat.v1.train.Server(
                tf.train.ClusterSpec(spec), job_name="worker", task_index=1, start=False
            )
        except tf.errors.UnknownError:  # "Could not start gRPC server": why, TF's log says
            if bind_failure(capfd.readouterr().err, [w1]) is None:
                raise
            raise PortTaken(f"port {w1} was taken before the Server could bind it") from None
        return spec

    was_active = _patching.is_active()
    _patching.activate()
    try:
        cluster_patch.register(Settings())
        tf.distribute.Server.create_local_server()  # port 0: any free one
        assert topology.learned_cluster() is None
        spec = with_new_ports(server)  # a Server that raised was not learned: it can be retried
        assert topology.detect() == dataclasses.replace(
            tf_config_topology(spec, "worker", 1), launcher="tf_server"
        )
    finally:
        if not was_active:
            _patching.deactivate()
