"""Each attempt its own traces (issue 44, point 2): a rerun or restart under the same launcher
identity (one TF_CONFIG, a requeued SLURM job) never shares a step trace id with an earlier
attempt, while every rank of one attempt still shares each step's trace; the job span says
which attempt it is and links to the one before where known; ``tf-otel analyze`` keeps the
attempts apart and says so."""

from __future__ import annotations

import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List

import pytest
from conftest import REPO, base_env, example, python, run
from otlp_files import file_spans
from ports import Tasks, free_port_pair, free_ports, with_new_ports

from tf_otel import record
from tf_otel.config import Settings
from tf_otel.job import topology
from tf_otel.otel.ids import job_span_ids, step_trace_id

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


def test_several_tf_config_workers_take_rank_0s_attempt_or_none() -> None:
    """A multi-worker TF_CONFIG: the attempt rank 0 handed out (instrument/attempt.py), else
    the job id alone, as before (docs/guides/RELIABILITY.md); TF_OTEL_ATTEMPT sets one."""
    ranks = [topology.detect(_tf_config(n, 2)) for n in (0, 1)]
    assert {t.attempt for t in ranks} == {""} and ranks[0].trace_scope == ranks[0].job_id
    told = [topology.detect(_tf_config(n, 2), attempt="3") for n in (0, 1)]
    assert {(t.attempt, t.previous_attempt) for t in told} == {("3", "2")}
    assert Settings.from_env({"TF_OTEL_ATTEMPT": " run-7 "}).attempt == "run-7"
    learned = [
        topology.launch_attempt(e, topology.detect(e), learned="ab12")
        for e in (_tf_config(0, 2), _tf_config(1, 2))
    ]
    assert learned == [("ab12", None)] * 2
    given = topology.detect(_tf_config(1, 2), job_id="mine")
    found, _ = topology.launch_attempt(_tf_config(1, 2), given, job_given=True, learned="ab12")
    assert found == ""  # a job id given is the whole identity
    slurm = topology.detect(_slurm(1, 2))  # a launcher's restart count decides
    assert topology.launch_attempt(_slurm(1, 2), slurm, learned="ab12") == ("2", "1")


def test_the_learned_attempt_is_this_process_s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """learn_attempt (what rank 0 handed out) counts for this process's environment only."""
    for name in [n for n in os.environ if n.startswith(("HOROVOD_", "OMPI_", "PMI", "SLURM_"))]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("TF_OTEL_ATTEMPT", raising=False)
    monkeypatch.setenv("TF_CONFIG", _tf_config(1, 2)["TF_CONFIG"])
    assert topology.learned_attempt() is None
    try:
        topology.learn_attempt("ab12")
        mine = topology.detect()
        assert (mine.attempt, mine.rank) == ("ab12", 1)
        assert mine.trace_scope == f"{mine.job_id}/attempt/ab12"
        assert topology.detect(_tf_config(1, 2)).attempt == ""  # another process's environment
    finally:
        topology.learn_attempt(None)
    assert topology.detect().attempt == ""


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


MWMS = REPO / "tests" / "distribute" / "scripts" / "mwms_train.py"
MWMS_STEPS = 4


def _mwms_launch(
    folder: Path, ports: List[int], coordinator: int, in_code: bool = False, **extra: str
) -> List[str]:
    """Two MultiWorkerMirroredStrategy workers (custom loop) under one TF_CONFIG (``in_code``:
    the same cluster given to the strategy by a resolver, no TF_CONFIG); their outputs. The same
    ports give the same cluster, hence the same job id, every launch."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    with Tasks([*ports, coordinator, coordinator + 1]) as tasks:
        for index in (0, 1):
            task = {"type": "worker", "index": index}
            given = (
                {"CLUSTER": json.dumps(cluster), "TASK_INDEX": str(index)}
                if in_code
                else {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}
            )
            env = base_env(
                TF_OTEL_ENABLED="1",
                TF_OTEL_FILE=str(folder / "spans-{rank}.jsonl"),
                TF_OTEL_COORDINATOR=f"127.0.0.1:{coordinator}",
                TF_OTEL_ROOT_WAIT_MS="20000",
                OTEL_TRACES_EXPORTER="none",
                OTEL_METRICS_EXPORTER="none",
                LOOP="custom",
                STEPS=str(MWMS_STEPS),
                **given,
                **extra,
            )
            tasks.start([python(), str(MWMS)], env, cwd=REPO)
        outputs = tasks.wait([0, 1], 300)
        for index, (process, output) in enumerate(zip(tasks.procs, outputs)):
            assert process.returncode == 0 and f"worker {index} done" in output, output[-3000:]
    return outputs


@pytest.mark.integration
def test_two_mwms_runs_under_one_tf_config_share_no_trace(tmp_path: Path) -> None:
    """A Kubernetes TFJob run twice: the same TF_CONFIG (ports and all) each time. Rank 0
    hands its attempt to the other worker through TensorFlow's coordination service when the
    strategy is created (instrument/attempt.py)."""
    folders = [tmp_path / "first", tmp_path / "again"]

    def both() -> List[List[str]]:
        ports, coordinator = free_ports(2), free_port_pair()
        return [_mwms_launch(folder, ports, coordinator) for folder in folders]

    outputs = with_new_ports(both)
    for output in (line for run_outputs in outputs for line in run_outputs):
        assert "no attempt id" not in output, output[-3000:]
    first, again = (_step_traces(folder, 2) for folder in folders)
    assert len(first) == len(again) == MWMS_STEPS
    assert not set(first) & set(again)
    jobs = [_job_span(folder)["attributes"] for folder in folders]
    job_id = jobs[0][record.ATTR_JOB_ID]
    assert jobs[1][record.ATTR_JOB_ID] == job_id  # one TF_CONFIG: one job
    attempts = [job.get(record.ATTR_JOB_ATTEMPT, "") for job in jobs]
    assert all(attempts) and attempts[0] != attempts[1], attempts
    # the control: without an attempt, step n's trace id is the job id's alone, the same in
    # both runs (a backend merges them)
    for traces, attempt in zip((first, again), attempts):
        for trace, spans in traces.items():
            step = next(s for s in spans if _category(s) == "step")["attributes"]
            key = f"{record.TF_FUNCTION}:{step[record.ATTR_FUNCTION_NAME]}"  # function.py's
            number = step[record.ATTR_STEP]
            assert trace == f"{step_trace_id(f'{job_id}/attempt/{attempt}', key, number):032x}"
            assert trace != f"{step_trace_id(job_id, key, number):032x}"


@pytest.mark.integration
def test_mwms_without_a_coordination_service_keeps_the_job_s_ids(tmp_path: Path) -> None:
    """Fail open: no coordination service (a program that turned it off), no attempt: each
    worker says so once, trains on, and every step is still one trace of both ranks, its id
    the job id's alone, as before."""

    def once() -> List[str]:
        ports, coordinator = free_ports(2), free_port_pair()
        return _mwms_launch(tmp_path, ports, coordinator, NO_COORDINATION_SERVICE="1")

    outputs = with_new_ports(once)
    for output in outputs:
        assert output.count("no attempt id from TensorFlow's coordination service") == 1, output
    traces = _step_traces(tmp_path, 2)
    assert len(traces) == MWMS_STEPS
    job = _job_span(tmp_path)["attributes"]
    assert not job.get(record.ATTR_JOB_ATTEMPT)
    for trace, spans in traces.items():
        step = next(s for s in spans if _category(s) == "step")["attributes"]
        key = f"{record.TF_FUNCTION}:{step[record.ATTR_FUNCTION_NAME]}"
        assert (
            trace == f"{step_trace_id(job[record.ATTR_JOB_ID], key, step[record.ATTR_STEP]):032x}"
        )


@pytest.mark.integration
def test_mwms_given_its_cluster_in_code_is_one_job(tmp_path: Path) -> None:
    """A MultiWorkerMirroredStrategy given a cluster resolver in code, no TF_CONFIG and no
    launcher: the strategy's cluster is the job's identity (instrument/cluster.py), so every
    step is one trace holding both workers' step spans under one job id, with an attempt
    (without it each worker was a lone process of its own job: two traces a step, one rank
    each)."""
    folder = tmp_path / "in-code"
    folder.mkdir()
    with_new_ports(lambda: _mwms_launch(folder, free_ports(2), free_port_pair(), in_code=True))
    steps = _step_traces(folder, 2)
    assert len(steps) == MWMS_STEPS, sorted(steps)
    job = _job_span(folder)["attributes"]
    assert job.get(record.ATTR_JOB_ATTEMPT), job
    ranks = {s["rank"] for s in file_spans(folder)}
    assert ranks == {0, 1}, ranks
