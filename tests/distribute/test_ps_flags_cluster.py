"""A TF1 parameter-server job configured by flags only (tf_cnn_benchmarks' way: --job_name
--task_index --ps_hosts --worker_hosts, no TF_CONFIG, no launcher) across the simulated cluster:
the ps on hostA, worker 0 on hostB, worker 1 on hostC (tests/cluster/sim.py). Every step is one
trace holding both workers' step spans under one root, and the op-detail steps hold RecvTensor
transfers from the ps with the variables' bytes, over the hosts' real links (issue 25 point 4;
on 127.0.0.1: tests/ops/test_ps_flags_identity.py).

    .venv/bin/pytest -q tests/distribute/test_ps_flags_cluster.py     (as root: namespaces)
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from typing import Any, Dict, List

import pytest
from conftest import REPO, base_env, python
from otlp_files import file_spans

sys.path.insert(0, str(REPO / "tests" / "cluster"))
from sim import Cluster  # noqa: E402

from tf_otel import record  # noqa: E402

pytestmark = pytest.mark.integration

SCRIPT = REPO / "tests" / "ops" / "scripts" / "ps_tf1_flags.py"
STEPS = 6
OPS_EVERY = 2  # op detail on steps 0, 2, 4
TASK_PORT = 2222  # each host its own namespace: the same port on every host
W1_BYTES, W2_BYTES = 32 * 64 * 4, 64 * 1 * 4  # the script's variables, float32


def test_flag_configured_ps_job_across_hosts_one_trace_per_step_with_transfers(tmp_path):
    (tmp_path / "spans").mkdir()
    with Cluster(hosts=3, slots=1) as cluster:
        ps_host, *worker_hosts = cluster.hosts
        ps_hosts = f"{cluster.address(ps_host)}:{TASK_PORT}"
        workers = ",".join(f"{cluster.address(h)}:{TASK_PORT}" for h in worker_hosts)
        env = base_env(
            TF_OTEL_ENABLED="1",
            TF_OTEL_OPS_EVERY=str(OPS_EVERY),
            TF_OTEL_ROOT_WAIT_MS="3000",  # worker 1's last extents reach rank 0 at exit
            TF_OTEL_FILE=str(tmp_path / "spans" / "spans-{rank}.jsonl"),
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
        )
        env.pop("TF_CONFIG", None)
        procs = []
        try:
            for host, (task, index) in zip(
                cluster.hosts, (("ps", 0), ("worker", 0), ("worker", 1))
            ):
                command = [
                    *cluster.net.prefix(host), python(), str(SCRIPT),
                    f"--job_name={task}", f"--task_index={index}",
                    f"--ps_hosts={ps_hosts}", f"--worker_hosts={workers}",
                    f"--steps={STEPS}", f"--sync_dir={tmp_path}",
                ]  # fmt: skip
                procs.append(
                    subprocess.Popen(
                        command, env=cluster.net.launch_env(env), cwd=REPO, text=True,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    )
                )  # fmt: skip
            outputs = [p.communicate(timeout=180)[0] for p in procs[1:]]
        finally:
            for p in procs:
                p.kill()  # the ps blocks in server.join() (C++): only SIGKILL ends it
                p.wait()
    for index, out in enumerate(outputs):
        assert f"worker {index} done steps={STEPS}" in out, out[-3000:]
    spans = file_spans(tmp_path / "spans")
    steps = [
        s
        for s in spans
        if s["attributes"].get(record.ATTR_CATEGORY) == record.STEP
        and "GradientDescent" in s["attributes"].get("tensorflow.session.fetches", "")
    ]
    roots = {
        s["trace"]: s
        for s in spans
        if s["attributes"].get(record.ATTR_CATEGORY) == record.STEP_ROOT
    }
    by_step: Dict[int, List[Dict[str, Any]]] = defaultdict(list)
    for s in steps:
        by_step[s["attributes"][record.ATTR_STEP]].append(s)
    assert sorted(by_step) == list(range(STEPS)), sorted(by_step)
    for number, members in by_step.items():
        assert sorted(s["rank"] for s in members) == [0, 1], number
        (trace,) = {s["trace"] for s in members}  # one trace per step, both workers
        root = roots[trace]
        assert root["rank"] == 0 and root["attributes"][record.ATTR_STEP_RANKS] == 2, root
        assert {s["parent"] for s in members} == {root["id"]}
    detail = {s["id"]: s for s in steps if s["attributes"][record.ATTR_STEP] % OPS_EVERY == 0}
    pulled: Dict[tuple, set] = defaultdict(set)  # (rank, step) -> bytes read from the ps
    for span in spans:
        parent = detail.get(span["parent"])
        attributes = span["attributes"]
        if parent is None or attributes.get(record.ATTR_CATEGORY) != "transfer":
            continue
        me = f"/job:worker/replica:0/task:{parent['rank']}/"
        if attributes["tensorflow.transfer.src"].startswith("/job:ps/") and attributes[
            "tensorflow.transfer.dst"
        ].startswith(me):
            pulled[(parent["rank"], parent["attributes"][record.ATTR_STEP])].add(
                attributes["tensorflow.transfer.bytes"]
            )
    for rank in (0, 1):
        for number in range(0, STEPS, OPS_EVERY):
            assert {W1_BYTES, W2_BYTES} <= pulled[(rank, number)], (rank, number, dict(pulled))
