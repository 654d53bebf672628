"""A real TF2 ParameterServerStrategy cluster (1 chief/coordinator + 1 ps + 2 workers on 127.0.0.1,
one process per task, TF_CONFIG): each closure ClusterCoordinator.schedule runs on a worker is one
step span of the chief with the worker it ran on, in its step trace under the step root."""

from __future__ import annotations

import json
from typing import Dict, Tuple

import pytest
from conftest import REPO, base_env, example, free_port_pair, free_ports, python
from ports import Tasks, with_new_ports

from tf_otel.job.topology import detect
from tf_otel.otel.ids import step_root_span_id, step_trace_id

pytestmark = pytest.mark.integration

CLOSURES = 8
KEY = "ps_closure:train_step"


def test_pss_one_step_span_per_closure_with_its_worker(receiver):
    def start() -> Tuple[str, Dict]:  # the chief's output; again with new ports if one was taken
        receiver.clear()  # nothing from a start that met a taken port
        chief, ps, w0, w1 = free_ports(4)
        coord = free_port_pair()
        cluster = {
            "chief": [f"127.0.0.1:{chief}"],
            "ps": [f"127.0.0.1:{ps}"],
            "worker": [f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"],
        }
        envs = {}
        for task, index in (("ps", 0), ("worker", 0), ("worker", 1), ("chief", 0)):
            envs[task, index] = base_env(
                **receiver.env("grpc"),
                TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": task, "index": index}}),
                TF_OTEL_ENABLED="1",
                TF_OTEL_ROOT_WAIT_MS="500",  # only the chief runs steps: roots do not wait
                TF_OTEL_COORDINATOR=f"127.0.0.1:{coord}",
                STEPS=str(CLOSURES),
            )
        # ps and workers block in server.join(): killed on leaving
        with Tasks([chief, ps, w0, w1, coord, coord + 1]) as tasks:
            for task in (("ps", 0), ("worker", 0), ("worker", 1), ("chief", 0)):
                tasks.start([python(), example("ps_tf2.py")], envs[task], cwd=REPO)
            return tasks.wait([3], timeout=240)[0], envs

    output, envs = with_new_ports(start)
    assert f"chief done closures={CLOSURES}" in output, output[-6000:]

    def closures(spans):
        return [s for s in spans if s.category == "step" and "tensorflow.ps.worker" in s.attributes]

    spans = receiver.wait_for(lambda s: len(closures(s)) >= CLOSURES, 30)
    spans = receiver.wait_for(lambda s: False, 2)  # roots are emitted after ROOT_WAIT_MS
    steps = closures(spans)
    assert sorted(s.attributes["tf_otel.step"] for s in steps) == list(range(CLOSURES))
    assert {s.rank for s in steps} == {0}  # the chief (TF_CONFIG order: chief, worker, ps)
    workers = set()
    for s in steps:
        index = s.attributes["tensorflow.ps.worker_index"]
        assert s.attributes["tensorflow.ps.worker"] == f"/job:worker/replica:0/task:{index}"
        assert s.attributes["tensorflow.function.name"] == "train_step"
        assert s.name == "rank 0 closure train_step"
        assert s.attributes["tf_otel.step.kind"] == "tf_function"
        assert s.end_ns > s.start_ns
        workers.add(index)
    assert workers == {0, 1}, workers  # closures ran on both workers

    # on the step traces: trace id of (job, key, step), child of that step's root span
    job_id = steps[0].resource.get("tf_otel.job.id") or detect(envs["chief", 0]).job_id
    roots = {s.span_id: s for s in spans if s.category == "step.root"}
    for s in steps:
        step = s.attributes["tf_otel.step"]
        assert s.trace_id == f"{step_trace_id(job_id, KEY, step):032x}"
        assert s.parent_id == f"{step_root_span_id(job_id, KEY, step):016x}"
        assert s.parent_id in roots, (step, sorted(roots))
        assert roots[s.parent_id].trace_id == s.trace_id
