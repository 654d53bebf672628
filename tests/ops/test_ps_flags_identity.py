"""A real TF1 parameter-server job whose tasks get their roles by command-line flags only, as
tf_cnn_benchmarks' ``--job_name --task_index --ps_hosts --worker_hosts`` (1 ps + 2 workers on
127.0.0.1, no TF_CONFIG, no launcher, no TF_OTEL_COORDINATOR / TF_OTEL_JOB_ID): tf_otel learns
the cluster from the ``tf.compat.v1.train.Server`` each task builds, so all three tasks share one
job id, the ps is a member that runs no steps, worker 0 (rank 0) hosts the coordinator at the
address every task derives from the job id, each step number is one trace holding both
workers' step spans under exactly one root, and ``TF_OTEL_FILE=spans-{rank}.jsonl`` gets the
learned rank (issue 25, point 2). The same cluster in TF_CONFIG is
tests/ops/test_ops_ps.py."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import List, Tuple

import pytest
from conftest import REPO, base_env, free_ports, python
from ports import Tasks, with_new_ports
from wholestep.analysis_of import analyze_received

from tf_otel.job import topology

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parent / "scripts" / "ps_tf1_flags.py"
STEPS = 6
TASKS = (("ps", 0), ("worker", 0), ("worker", 1))


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _cluster() -> Tuple[dict, List[int]]:
    """Free task ports whose derived coordinator port (and the clock service's, next to it) is
    free too: the test sets no TF_OTEL_COORDINATOR, rank 0 binds what the job id says. The
    cluster and every port its tasks bind."""
    for _ in range(20):
        ps, w0, w1 = free_ports(3)
        cluster = {"ps": [f"127.0.0.1:{ps}"], "worker": [f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"]}
        found = topology.program_cluster(cluster, "worker", 0)
        assert found is not None
        address = found.topology("").coordinator_address()
        assert address is not None
        if _free(address[1]) and _free(address[1] + 1):
            return cluster, [ps, w0, w1, address[1], address[1] + 1]
    raise RuntimeError("no free coordinator port for a cluster")


def test_flag_configured_ps_job_is_one_job_with_one_trace_per_step(receiver, tmp_path: Path):
    def start() -> Tuple[dict, List[str]]:  # again with new ports if one was taken
        receiver.clear()  # nothing from a start that met a taken port
        shutil.rmtree(tmp_path / "spans", ignore_errors=True)
        sync = Path(tempfile.mkdtemp(prefix="sync-", dir=tmp_path))  # the workers meet here
        cluster, ports = _cluster()
        env = base_env(
            **receiver.env("grpc"),
            TF_OTEL_ENABLED="1",
            TF_OTEL_ROOT_WAIT_MS="3000",  # worker 1's last extents reach rank 0 at exit
            TF_OTEL_FILE=str(tmp_path / "spans" / "spans-{rank}.jsonl"),  # named at first spans
        )
        env.pop("TF_CONFIG", None)
        with Tasks(ports) as tasks:  # the ps blocks in server.join(): killed on leaving
            for task, index in TASKS:
                command = [
                    python(), str(SCRIPT), f"--job_name={task}", f"--task_index={index}",
                    f"--ps_hosts={','.join(cluster['ps'])}",
                    f"--worker_hosts={','.join(cluster['worker'])}",
                    f"--steps={STEPS}", f"--sync_dir={sync}",
                ]  # fmt: skip
                tasks.start(command, env, cwd=REPO)
            tasks.wait([1, 2], timeout=150)
        return cluster, [tasks.output(i) for i in range(len(TASKS))]

    cluster, (ps_output, *outputs) = with_new_ports(start)
    for index, out in enumerate(outputs):
        assert f"worker {index} done steps={STEPS}" in out, out[-3000:]

    # every task, the ps included, took its identity from its own Server
    identities = {}
    for (task, index), out in zip(TASKS, [ps_output, *outputs]):
        line = next((ln for ln in out.splitlines() if ln.startswith("identity ")), None)
        assert line is not None, (task, index, out[-3000:])
        identities[task, index] = json.loads(line[len("identity ") :])
    assert {i["launcher"] for i in identities.values()} == {"tf_server"}
    assert len({i["job_id"] for i in identities.values()}) == 1, identities
    assert {t: i["rank"] for t, i in identities.items()} == {
        ("worker", 0): 0,
        ("worker", 1): 1,
        ("ps", 0): 2,
    }
    assert {i["world_size"] for i in identities.values()} == {3}  # the ps is a member ...
    assert {i["stepping_ranks"] for i in identities.values()} == {2}  # ... that runs no steps
    assert identities["ps", 0]["task"] == "ps:0"
    job_id = identities["worker", 0]["job_id"]
    # the same answer as the same cluster in TF_CONFIG
    tf_config = topology.detect(
        {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}})}
    )
    assert (tf_config.job_id, tf_config.rank, tf_config.world_size) == (job_id, 2, 3)

    def train_steps(spans):
        return [
            s
            for s in spans
            if s.category == "step"
            and "GradientDescent" in s.attributes.get("tensorflow.session.fetches", "")
        ]

    def roots(spans):
        return [s for s in spans if s.category == "step.root"]

    spans = receiver.wait_for(
        lambda s: len(train_steps(s)) >= 2 * STEPS and len(roots(s)) >= STEPS, 30
    )
    spans = receiver.wait_for(lambda s: False, 1)  # nothing more should come: no second root
    steps = train_steps(spans)
    assert sorted((s.rank, s.attributes["tf_otel.step"]) for s in steps) == sorted(
        (rank, step) for rank in (0, 1) for step in range(STEPS)
    )
    for s in steps:  # the step spans carry the learned identity on their resource
        assert s.resource["tf_otel.job.id"] == job_id
        assert s.resource["tf_otel.world_size"] == 3
        assert s.resource["tf_otel.rank"] == s.rank
        assert s.resource["tf_otel.launcher"] == "tf_server"
    by_step = defaultdict(list)
    for s in steps:
        by_step[s.attributes["tf_otel.step"]].append(s)
    root_spans = [r for r in roots(spans) if r.attributes.get("tf_otel.job.id") == job_id]
    train_roots = {r.trace_id: r for r in root_spans if {r.trace_id} & {s.trace_id for s in steps}}
    for step, members in sorted(by_step.items()):
        assert {s.rank for s in members} == {0, 1}, step
        traces = {s.trace_id for s in members}
        assert len(traces) == 1, (step, traces)  # one trace per step holding both workers
        trace = traces.pop()
        in_trace = [r for r in root_spans if r.trace_id == trace]
        assert len(in_trace) == 1, (step, in_trace)  # exactly one root per step
        root = in_trace[0]
        assert root.attributes["tf_otel.step"] == step
        assert {s.parent_id for s in members} == {root.span_id}
        assert root.attributes["tf_otel.step.ranks"] == 2, root.attributes  # both workers
    assert len(train_roots) == STEPS
    assert {r.resource["tf_otel.rank"] for r in root_spans} == {0}  # rank 0 emits the roots
    # TF_OTEL_FILE's {rank} is the learned rank; the ps, which makes no spans, writes no file
    files = sorted(p.name for p in (tmp_path / "spans").iterdir())
    assert files == ["spans-0.jsonl", "spans-1.jsonl"], files
    for rank in (0, 1):
        for line in (tmp_path / "spans" / f"spans-{rank}.jsonl").read_text().splitlines():
            for resource_spans in json.loads(line)["resourceSpans"]:
                attributes = resource_spans["resource"]["attributes"]
                found = {a["key"]: a["value"] for a in attributes}
                assert found["tf_otel.rank"] == {"intValue": str(rank)}, found
    # the analysis expects the two stepping ranks in a step, not the ps (it runs none)
    result = analyze_received(spans)
    assert not [w for w in result.warnings if "no spans from ranks" in w], result.warnings
