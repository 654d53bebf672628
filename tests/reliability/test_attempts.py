"""Each attempt its own traces (issue 44, point 2): a rerun or restart under the same launcher
identity (one TF_CONFIG, a requeued SLURM job) never shares a step trace id with an earlier
attempt, while every rank of one attempt still shares each step's trace; the job span says
which attempt it is and links to the one before where known; ``tf-otel analyze`` keeps the
attempts apart and says so."""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List

import pytest
from conftest import REPO, base_env, example, python, run
from otlp_files import file_spans

from tf_otel import record
from tf_otel.config import Settings
from tf_otel.job import topology
from tf_otel.pipeline.ids import job_span_ids, step_trace_id

SLURM = {
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "localhost",
}


def _slurm(rank: int, restarts: Any = None) -> Dict[str, str]:
    env = {**SLURM, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)}
    if restarts is not None:
        env["SLURM_RESTART_COUNT"] = str(restarts)
    return env


def _tf_config(index: int = 0, workers: int = 1) -> Dict[str, str]:
    cluster = {"worker": [f"localhost:{12345 + n}" for n in range(workers)]}
    task = {"type": "worker", "index": index}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}


# -- where the attempt comes from (no process started) ----------------------------------------


def test_a_slurm_requeue_is_another_attempt_of_the_same_job() -> None:
    first = [topology.detect(_slurm(rank)) for rank in (0, 1)]
    again = [topology.detect(_slurm(rank, 1)) for rank in (0, 1)]
    assert {t.job_id for t in first + again} == {first[0].job_id}  # the same job
    assert {t.attempt for t in first} == {"0"} and {t.attempt for t in again} == {"1"}
    assert again[0].previous_attempt == "0" and first[0].previous_attempt is None
    ids = {(t.attempt, step_trace_id(t.trace_scope, "keras_train", 7)) for t in first + again}
    assert len(ids) == 2  # one trace a step within an attempt, another in the next


def test_a_single_worker_tf_config_draws_one_attempt_a_process() -> None:
    one, two = topology.detect(_tf_config()), topology.detect(_tf_config())
    assert one.attempt and one == two  # asked again in the process: the same
    assert one.trace_scope != one.job_id


def test_several_tf_config_workers_have_none_unless_told() -> None:
    """Nothing tells two launches of a multi-worker TF_CONFIG apart before the first step
    (docs/guides/RELIABILITY.md): the job id alone, as before; TF_OTEL_ATTEMPT sets one."""
    ranks = [topology.detect(_tf_config(n, 2)) for n in (0, 1)]
    assert {t.attempt for t in ranks} == {""} and ranks[0].trace_scope == ranks[0].job_id
    told = [topology.detect(_tf_config(n, 2), attempt="3") for n in (0, 1)]
    assert {(t.attempt, t.previous_attempt) for t in told} == {("3", "2")}
    assert Settings.from_env({"TF_OTEL_ATTEMPT": " run-7 "}).attempt == "run-7"


def test_a_launch_id_tells_launches_apart_where_the_job_id_is_not_made_of_it() -> None:
    gloo = {
        "HOROVOD_RANK": "0",
        "HOROVOD_SIZE": "2",
        "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "1234",
    }
    assert topology.detect(gloo).attempt == ""  # its job id is the launch's already
    in_slurm = topology.detect({**gloo, **SLURM})  # horovodrun inside a SLURM job step
    other = topology.detect({**gloo, **SLURM, "HOROVOD_GLOO_RENDEZVOUS_PORT": "99"})
    assert in_slurm.attempt.startswith("0.") and in_slurm.attempt != other.attempt
    assert in_slurm.previous_attempt is None and in_slurm.job_id == other.job_id
    assert topology.detect({}).attempt == ""  # a lone process: its job id is random


def test_a_job_id_given_is_the_whole_identity_unless_told() -> None:
    """TF_OTEL_JOB_ID: the same trace ids every launch (tests and users pick the steps its
    sampling and detail choose by them), unless a restart count or TF_OTEL_ATTEMPT says."""
    gloo = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1", "HOROVOD_LOCAL_RANK": "0"}
    gloo.update(HOROVOD_LOCAL_SIZE="1", HOROVOD_GLOO_RENDEZVOUS_ADDR="h")
    gloo.update(HOROVOD_GLOO_RENDEZVOUS_PORT="1")
    for env in (gloo, _tf_config(), {}):
        topo = topology.detect(env, job_id="mine")
        assert topo.attempt == "" and topo.trace_scope == "mine", env
    assert topology.detect(_slurm(0, 2), job_id="mine").attempt == "2"
    assert topology.detect({}, job_id="mine", attempt="b").trace_scope == "mine/attempt/b"


# -- real runs ---------------------------------------------------------------------------------


def _by_trace(folder: Path) -> Dict[str, List[Dict[str, Any]]]:
    traces: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for span in file_spans(folder):
        traces[span["trace"]].append(span)
    return traces


def _category(span: Dict[str, Any]) -> str:
    return span["attributes"].get(record.ATTR_CATEGORY, "")


def _step_traces(folder: Path, ranks: int) -> Dict[str, List[Dict[str, Any]]]:
    """The folder's step traces, each checked: one root, one step span of every rank."""
    steps = {t: s for t, s in _by_trace(folder).items() if any(_category(x) == "step" for x in s)}
    assert steps
    for trace, spans in steps.items():
        assert sum(_category(s) == "step.root" for s in spans) == 1, trace
        assert sorted(s["rank"] for s in spans if _category(s) == "step") == list(range(ranks))
    numbers = [s["attributes"][record.ATTR_STEP] for t in steps.values() for s in t]
    assert len(set(numbers)) == len(steps)  # every step one trace
    return steps


def _job_span(folder: Path) -> Dict[str, Any]:
    (job,) = [s for s in file_spans(folder) if _category(s) == "job"]
    return job


def _analyze(*args: str) -> subprocess.CompletedProcess:
    return run([python(), "-m", "tf_otel.cli", "analyze", *args], base_env(), check=False)


@pytest.mark.integration
def test_two_runs_under_one_tf_config_share_no_trace(tmp_path: Path) -> None:
    folders = []
    for attempt in ("a", "b"):
        folder = tmp_path / attempt
        env = base_env(
            TF_OTEL_ENABLED="1",
            TF_OTEL_FILE=str(folder / "spans.jsonl"),
            STEPS="5",
            EVALUATE="0",
            **_tf_config(),
        )
        assert "done steps=5" in run([python(), example("keras_fit.py")], env).stdout
        folders.append(folder)
    first, second = (_step_traces(folder, 1) for folder in folders)
    assert not set(first) & set(second)
    jobs = [_job_span(folder)["attributes"] for folder in folders]
    assert jobs[0][record.ATTR_JOB_ID] == jobs[1][record.ATTR_JOB_ID]  # one TF_CONFIG: one job
    attempts = [job[record.ATTR_JOB_ATTEMPT] for job in jobs]
    assert attempts[0] != attempts[1]
    # the analysis keeps them apart and says so
    both = _analyze(str(folders[0]), str(folders[1]))
    assert both.returncode == 2 and "2 attempts of job" in both.stderr, both.stderr
    job_id = jobs[0][record.ATTR_JOB_ID]
    chosen = _analyze(
        str(folders[0]), str(folders[1]), "--job", f"{job_id}@{attempts[1]}", "--format", "json"
    )
    assert chosen.returncode == 0, chosen.stderr
    report = json.loads(chosen.stdout)
    assert report["job_id"] == f"{job_id}@{attempts[1]}"
    assert any(f"{job_id}@{attempts[0]}" in w for w in report["warnings"]), report["warnings"]
    one = _analyze(str(folders[0]), "--job", job_id, "--format", "json")  # its only attempt
    assert one.returncode == 0 and json.loads(one.stdout)["job_id"] == f"{job_id}@{attempts[0]}"


def _slurm_launch(folder: Path, restarts: Any) -> None:
    """Two ranks of a custom loop as srun starts them (SLURM's variables), on this host."""
    processes = []
    for rank in (0, 1):
        env = base_env(
            TF_OTEL_ENABLED="1",
            TF_OTEL_FILE=str(folder / "spans-{rank}.jsonl"),
            TF_OTEL_ROOT_WAIT_MS="20000",
            STEPS="6",
            **_slurm(rank, restarts),
        )
        processes.append(
            subprocess.Popen(
                [python(), example("custom_loop.py")],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0 and "done steps=6" in out, err[-3000:]


@pytest.mark.integration
def test_a_slurm_requeue_shares_no_trace_and_links_the_attempt_before(tmp_path: Path) -> None:
    first, again = tmp_path / "first", tmp_path / "requeued"
    _slurm_launch(first, None)  # the first run: SLURM sets no restart count
    _slurm_launch(again, 1)
    before, after = _step_traces(first, 2), _step_traces(again, 2)
    assert len(before) == len(after) == 6 and not set(before) & set(after)
    job_before, job_after = _job_span(first), _job_span(again)
    assert job_before["attributes"][record.ATTR_JOB_ATTEMPT] == "0"
    assert job_after["attributes"][record.ATTR_JOB_ATTEMPT] == "1"
    assert job_after["attributes"][record.ATTR_JOB_PREVIOUS_ATTEMPT] == "0"
    job_id = job_before["attributes"][record.ATTR_JOB_ID]
    trace_id, span_id = job_span_ids(f"{job_id}/attempt/0")
    assert (job_before["trace"], job_before["id"]) == (f"{trace_id:032x}", f"{span_id:016x}")
    links = _links(again)
    assert links == [(job_before["trace"], job_before["id"])]


def _links(folder: Path) -> List[tuple]:
    """The job span's links, as written."""
    found = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            for resource_spans in json.loads(line).get("resourceSpans", []):
                for scope in resource_spans.get("scopeSpans", []):
                    for span in scope.get("spans", []):
                        if span["name"].startswith("training job"):
                            found += [(x["traceId"], x["spanId"]) for x in span.get("links", [])]
    return found
