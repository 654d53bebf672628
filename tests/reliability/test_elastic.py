"""Horovod Elastic under tf_otel (issue 44, point 3): a real ``horovodrun --min-np 2 --max-np 3
--host-discovery-script`` run on localhost (gloo over ``lo``) whose discovery script drops a
slot while it trains, 3 -> 2. Horovod's driver removes the worker (its own ``hvd.init`` in the
reset aborts it, or the driver SIGTERMs it), the other two reset and train on.

Asserted against each process's own truth (a line per call of its train step: its rank and
world then): every step trace holds exactly the ranks that ran that step, the removed worker's
included up to its last step (it wrote its spans before the reset could end it), no step split
across traces, one root per step carrying the size of the world that ran it and none partial,
one world-change record (on the first root of the new world and on the job span), no stall
record, and ``tf-otel analyze`` gives no missing-rank or stopped-rank warning, one world line.
Control: the same span files with the roots' world size taken out (as tf_otel wrote them
before) make the analysis warn about rank 2 again ("rank 2's spans end at step N ...: it
stopped or was killed").

Prints one ``FIGURES`` line for docs/guides/RELIABILITY.md."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import pytest
from conftest import REPO, VENV_BIN, base_env, python, run

pytestmark = pytest.mark.integration

SCRIPTS = REPO / "tests" / "reliability" / "scripts"
STEPS, SHRINK_AT = 24, 6


def _attributes(items: List[Dict[str, Any]]) -> Dict[str, Any]:
    out = {}
    for item in items:
        value = item["value"]
        if "arrayValue" in value:
            out[item["key"]] = [int(v["intValue"]) for v in value["arrayValue"].get("values", [])]
        else:
            (raw,) = value.values()
            out[item["key"]] = int(raw) if "intValue" in value else raw
    return out


def _spans(folder: Path) -> List[Dict[str, Any]]:
    spans = []
    for path in sorted(folder.glob("spans-*.jsonl")):
        for line in path.read_bytes().splitlines():
            for resource in json.loads(line).get("resourceSpans", []):
                for scope in resource.get("scopeSpans", []):
                    for span in scope.get("spans", []):
                        span["attrs"] = _attributes(span.get("attributes", []))
                        span["file"] = path.name
                        spans.append(span)
    return spans


def _truth(folder: Path) -> Tuple[Dict[int, Set[int]], Dict[int, int], Dict[str, List[int]]]:
    """Per step (the process's n-th call of train_step is its step n): the processes that ran
    it, each by the rank it began with (tf_otel's rank of the process: it keeps it when Horovod
    renumbers), and the world then; per process, its Horovod rank at each call."""
    ranks: Dict[int, Set[int]] = defaultdict(set)
    world: Dict[int, int] = {}
    processes: Dict[str, List[int]] = {}
    for path in sorted(folder.glob("truth-*.txt")):
        lines = [line.split() for line in path.read_text().splitlines()]
        processes[path.name] = [int(line[1]) for line in lines]
        for step, (_pid, _rank, size, _batch, _host) in enumerate(lines):
            ranks[step].add(processes[path.name][0])
            assert world.setdefault(step, int(size)) == int(size), (step, path)
    return ranks, world, processes


def _hash_seed(hosts: List[str], first: List[str]) -> str:
    """A PYTHONHASHSEED under which horovodrun's driver orders ``hosts`` (one slot each; it
    takes them from a set, so the order, and with it which host holds rank 0, follows the
    string hashes) beginning with ``first``."""
    probe = f"print(','.join(set({hosts!r})))"
    for seed in range(64):
        env = {**base_env(), "PYTHONHASHSEED": str(seed)}
        order = subprocess.run(
            [python(), "-c", probe], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        if order.split(",")[: len(first)] == first:
            return str(seed)
    raise AssertionError(f"no seed orders {hosts} as {first}...")


def _elastic_run(
    tmp_path: Path, hosts: str, shrink_hosts: str, seed: str = "0"
) -> Tuple[str, float, Path, Path]:
    """horovodrun --min-np 2 --max-np 3 on ``hosts`` (one per line), the discovery script
    printing ``shrink_hosts`` from batch SHRINK_AT, the driver's host order from ``seed``:
    (output, wall seconds, span folder, truth folder)."""
    folder, truth = tmp_path / "spans", tmp_path / "truth"
    truth.mkdir()
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text(hosts.replace(",", "\n") + "\n")
    env = base_env(
        TF_OTEL_ENABLED="1",
        TF_OTEL_FILE=str(folder / "spans-{rank}-{pid}.jsonl"),
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        HOSTS_FILE=str(hosts_file),
        TRUTH_DIR=str(truth),
        STEPS=str(STEPS),
        SHRINK_AT=str(SHRINK_AT),
        SHRINK_TO="2",
        SHRINK_HOSTS=shrink_hosts,
        STEP_SLEEP_S="0.15",
        PYTHONHASHSEED=seed,
    )
    command = [
        str(VENV_BIN / "horovodrun"), "-np", "3", "--min-np", "2", "--max-np", "3",
        "--network-interface", "lo",
        "--host-discovery-script", str(SCRIPTS / "elastic_discover.sh"),
        python(), str(SCRIPTS / "elastic_train.py"),
    ]  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=400)
    wall = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output, wall, folder, truth


def _first_world(line: str) -> str:
    """An OTLP-JSON line whose roots say a world of 3."""
    data = json.loads(line)
    for resource in data.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for item in span.get("attributes", []):
                    if item["key"] in ("tf_otel.world_size", "tf_otel.step_world_size"):
                        item["value"] = {"intValue": "3"}
                    elif item["key"] == "tf_otel.step.world_ranks":
                        item["key"] = "dropped.world_ranks"
    return json.dumps(data)


def _analyze(folder: Path) -> Dict[str, Any]:
    done = run(
        [python(), "-m", "tf_otel.cli", "analyze", str(folder), "--format", "json"],
        base_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("leaving", ["last", "middle"])
def test_elastic_shrink_each_step_holds_the_ranks_that_ran_it(tmp_path: Path, leaving: str) -> None:
    """``last``: localhost:3 -> localhost:2, rank 2 leaves. ``middle``: three one-slot hosts
    (localhost, 127.0.0.1, this machine's name; all local), 127.0.0.1 holding rank 1 leaves:
    Horovod renumbers rank 2 as 1, which keeps its rank 2, and the new world's roots name their
    ranks [0, 2]."""
    if leaving == "last":
        departed = 2
        output, wall, folder, truth = _elastic_run(tmp_path, "localhost:3", "localhost:2")
    else:
        departed, name = 1, socket.gethostname()
        seed = _hash_seed(["localhost", "127.0.0.1", name], ["localhost", "127.0.0.1"])
        output, wall, folder, truth = _elastic_run(
            tmp_path, f"localhost:1,127.0.0.1:1,{name}:1", f"localhost:1,{name}:1", seed
        )
    ran, world, processes = _truth(truth)
    assert len(processes) == 3, processes
    removed = [
        name for name, calls in processes.items() if len(calls) < max(map(len, processes.values()))
    ]
    assert len(removed) == 1, output[-4000:]  # the world did shrink while the job ran
    assert processes[removed[0]][0] == departed, processes
    first_small = min(step for step, size in world.items() if size == 2)
    assert 0 < first_small < max(world), world

    spans = _spans(folder)
    step_spans = [s for s in spans if s["attrs"].get("tf_otel.category") == "step"]
    roots = [s for s in spans if s["attrs"].get("tf_otel.category") == "step.root"]
    traced: Dict[int, Set[int]] = defaultdict(set)
    traces: Dict[int, Set[str]] = defaultdict(set)
    for span in step_spans:
        assert not span["attrs"].get("tf_otel.step.in_flight"), span["attrs"]
        traced[span["attrs"]["tf_otel.step"]].add(span["attrs"]["tf_otel.rank"])
        traces[span["attrs"]["tf_otel.step"]].add(span["traceId"])
    # every step trace holds exactly the ranks that ran it, the removed worker's last included
    assert {step: sorted(r) for step, r in traced.items()} == {
        step: sorted(r) for step, r in ran.items()
    }
    by_step = {r["attrs"]["tf_otel.step"]: r for r in roots}
    assert len(by_step) == len(roots) == len(ran), sorted(by_step)
    for step, root in by_step.items():
        assert traces[step] == {root["traceId"]}, (step, traces[step])  # never split
        assert root["attrs"]["tf_otel.step_world_size"] == world[step], (step, root["attrs"])
        assert "tf_otel.step.partial" not in root["attrs"], (step, root["attrs"])
    events = [
        (root["attrs"]["tf_otel.step"], _attributes(event.get("attributes", [])))
        for root in roots
        for event in root.get("events", [])
        if event["name"] == "tf_otel.world.change"
    ]
    assert len(events) == 1, events
    at, change = events[0]
    assert at == first_small, (at, first_small)
    assert (change["tf_otel.world.before"], change["tf_otel.world.after"]) == (3, 2)
    assert change["tf_otel.world.left"] == [departed], change
    said = f"world 3 -> 2 at step {first_small}: rank {departed} on host"
    assert change["message"].startswith(said), change
    staying = [r for r in (0, 1, 2) if r != departed]
    for step, root in by_step.items():  # a world not 0..n-1 is named on its roots
        named = root["attrs"].get("tf_otel.step.world_ranks")
        assert named == (staying if step >= first_small and departed != 2 else None), root
    (job,) = [s for s in spans if s["attrs"].get("tf_otel.category") == "job"]
    assert [e["name"] for e in job.get("events", [])] == ["tf_otel.world.change"]
    assert not [s for s in spans if s["attrs"].get("tf_otel.category") == "stall"]

    report = _analyze(folder)
    warnings = report["warnings"]
    assert not any("no spans from ranks" in w or "spans end at step" in w for w in warnings)
    assert (
        f"world 3 -> 2 at step {first_small}: each step is judged by the ranks of its own world"
        in warnings
    ), warnings  # noqa: E501
    assert {s["step"]: s["world_size"] for s in report["steps"]} == world

    # control: the same files with every root saying the first world, as tf_otel's roots did
    # before: the analysis then warns about the departed rank as stopped or missing
    control = tmp_path / "control"
    control.mkdir()
    for path in folder.glob("spans-*.jsonl"):
        (control / path.name).write_text(
            "".join(_first_world(line) + "\n" for line in path.read_text().splitlines())
        )
    said = _analyze(control)["warnings"]
    assert any(
        f"no spans from ranks [{departed}]" in w
        or w.startswith(f"rank {departed}'s spans end at step")
        for w in said
    ), said
    print(
        f"FIGURES elastic_shrink_{leaving} wall_s={wall:.1f} steps={len(ran)} "
        f"first_step_of_2={first_small} removed_calls={len(processes[removed[0]])} "
        f"roots={len(roots)}",
        file=sys.stderr,
    )


def test_rank0_leaving_hurts_nothing_and_nothing_hangs(tmp_path: Path) -> None:
    """Rank 0's host (127.0.0.1, one slot; the others on localhost) leaves: Horovod's init
    aborts rank 0's process (the coordinator, the roots and the job span go with it) and
    renumbers the survivors 0 and 1. The job trains on to its end and exits 0; rank 0's spans
    hold every step it ran (written before the reset); each survivor keeps the rank it began
    with (said once), so every step trace holds exactly the processes that ran that step, each
    under its own rank, and none is split; the survivors' links to the gone rank 0 hold
    nothing up: they train on at their pace. The analysis exits 0 and names rank 0 as the rank
    whose spans ended."""
    seed = _hash_seed(["127.0.0.1", "localhost"], ["127.0.0.1"])
    output, wall, folder, truth = _elastic_run(
        tmp_path, "127.0.0.1:1,localhost:2", "localhost:2", seed
    )
    ran, world, processes = _truth(truth)
    (left,) = [name for name, calls in processes.items() if len(calls) < len(ran)]
    assert processes[left][0] == 0, processes  # rank 0's process left
    survivors = [calls for name, calls in processes.items() if name != left]
    assert sorted(calls[0] for calls in survivors) == [1, 2]
    assert sorted(calls[-1] for calls in survivors) == [0, 1], "Horovod renumbered them"
    assert output.count("tf_otel: Horovod renumbered this process") == 2, output[-3000:]
    spans = _spans(folder)
    traced: Dict[int, List[int]] = defaultdict(list)
    traces: Dict[int, Set[str]] = defaultdict(set)
    for span in spans:
        if span["attrs"].get("tf_otel.category") == "step":
            traced[span["attrs"]["tf_otel.step"]].append(span["attrs"]["tf_otel.rank"])
            traces[span["attrs"]["tf_otel.step"]].add(span["traceId"])
    assert {step: sorted(r) for step, r in traced.items()} == {
        step: sorted(r) for step, r in ran.items()
    }  # each process once, under the rank it began with (no two share one)
    assert all(len(ids) == 1 for ids in traces.values()), traces
    first_small = min(step for step, size in world.items() if size == 2)
    roots = {
        s["attrs"]["tf_otel.step"]
        for s in spans
        if s["attrs"].get("tf_otel.category") == "step.root"
    }
    assert roots and max(roots) < first_small, "no roots once rank 0 has gone"
    report = _analyze(folder)
    last = len(processes[left]) - 1
    said = f"rank 0's spans end at step {last} (the others ran to {len(ran) - 1})"
    assert any(said in w for w in report["warnings"]), report["warnings"]
    assert not any("rank 1" in w or "rank 2" in w or "ranks [1" in w for w in report["warnings"])
    print(
        f"FIGURES elastic_rank0_left wall_s={wall:.1f} steps={len(ran)} "
        f"first_step_of_2={first_small} rank0_calls={len(processes[left])}",
        file=sys.stderr,
    )
