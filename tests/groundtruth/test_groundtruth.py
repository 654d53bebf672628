"""Ground truth: 4 Horovod ranks, one slowed in known steps; `tf-otel analyze --format json` must
name exactly those steps, that rank and the right cause, with the delay within 10 %; the
control run (nothing injected) must name nothing.

One horovodrun per scenario on the simulated cluster (tests/cluster/sim.py: hostA and hostB as
network namespaces, two ranks each, horovodrun over ssh from a login host; one cluster for the
module), written as OTLP-JSON files on the shared filesystem (TF_OTEL_FILE per rank) and
analysed by the real CLI.

Scenarios (tests/groundtruth/train_groundtruth.py):
  late    - rank 2 sleeps DELAY_MS before it begins steps 5 and 12    -> cause before_step
  input   - rank 2's tf.data generator sleeps DELAY_MS in those steps -> cause input
  compute - rank 2 trains those steps on a 256x larger batch          -> cause compute;
            the delay's truth is measured in-process by every rank (its own work before the
            gradient allreduce); found through every rank's own collective arrival
            (TF_OTEL_HOROVOD_EVERY=1: horovod.arrival=stamp, exact with the response cache on)
  none    - nothing injected: no step straggler, no straggler finding
  slowlink - nothing injected in the job; hostB's link (ranks 2, 3) rate-limited to LINK_RATE
            (tc tbf both ways) for the run: no rank is named for it, and the path's
            communication rises by the link's cost against ``none`` (the tolerance is argued
            in the test)

A shared 2-core host slows ranks by itself now and then (a rank descheduled for 100 ms): a
step the analysis names beyond the injected ones must be one the ranks' own in-process
measurements confirm (the named rank really was ready that much later than the others: its
wall-clock ready time minus the others' median, at least half the named excess). On a quiet
host that leaves nothing to name in the control.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

import pytest
from conftest import REPO, VENV_BIN, base_env, run
from otlp_files import file_spans

sys.path.insert(0, str(REPO / "tests" / "cluster"))
from sim import Cluster  # noqa: E402

from tf_otel import record  # noqa: E402
from tf_otel.analysis.otlp_values import attributes_dict  # noqa: E402

pytestmark = pytest.mark.integration

SCRIPT = REPO / "tests" / "groundtruth" / "train_groundtruth.py"
RANKS = 4
SLOW_RANK = 2
SLOW_STEPS = [5, 12]
DELAY_MS = 300.0
STEPS = 20  # steps are cheap next to the launch; the run's noise is learned from them
CAUSE = {"late": "before_step", "input": "input", "compute": "compute"}
SLOW_HOST = "hostB"  # ranks 2 and 3
LINK_RATE = "50mbit"
WIDTH = 512  # train_groundtruth.py's layers: 64 -> WIDTH -> WIDTH -> 1, float32 gradients
GRADIENT_BYTES = (64 * WIDTH + WIDTH * WIDTH + WIDTH) * 4
# scenario, the analysis' JSON report, the ranks' in-process truth, the step roots' attributes
Run = Tuple[str, Dict[str, Any], Dict[str, Dict[int, Dict[int, float]]], Dict[int, Dict[str, Any]]]


@pytest.fixture(scope="module")
def cluster():
    """Two hosts x two ranks (network namespaces, horovodrun over ssh), one for the module."""
    with Cluster(hosts=2, slots=2) as c:
        assert c.host_ranks() == {"hostA": [0, 1], "hostB": [SLOW_RANK, 3]}
        yield c


@pytest.fixture(scope="module")
def launch(cluster) -> Callable[[Dict[str, str], bool], None]:
    """Runs the training script on the cluster's RANKS ranks, hostB's link slowed if asked."""

    def start(env: Dict[str, str], slow: bool) -> None:
        link = cluster.slowed_link(SLOW_HOST, LINK_RATE) if slow else contextlib.nullcontext()
        with link:
            cluster.horovodrun(str(SCRIPT), cluster.env(**env), np=RANKS, timeout=420)

    return start


@pytest.fixture(scope="module")
def runs(launch, tmp_path_factory) -> Callable[[str], Run]:
    """One horovodrun per scenario, analysed; cached so the slow-link test reuses the control."""
    done: Dict[str, Run] = {}

    def get(name: str) -> Run:
        if name not in done:
            done[name] = _run(name, launch, tmp_path_factory)
        return done[name]

    return get


def _run(name: str, launch, tmp_path_factory) -> Run:
    out = tmp_path_factory.mktemp(f"groundtruth-{name}")
    (out / "spans").mkdir()
    (out / "truth").mkdir()
    env = dict(
        TF_OTEL_ENABLED="1",
        TF_OTEL_FILE=str(out / "spans" / "spans-{rank}.jsonl"),
        TF_OTEL_STEP_FUNCTIONS="train_step",
        TF_OTEL_HOROVOD_EVERY="1",  # collective detail, every rank's own arrival, every step
        OTEL_TRACES_EXPORTER="none",
        SCENARIO="none" if name == "slowlink" else name,  # the link is slowed outside the job
        SLOW_RANK=str(SLOW_RANK),
        SLOW_STEPS=",".join(map(str, SLOW_STEPS)),
        DELAY_MS=str(DELAY_MS),
        STEPS=str(STEPS),
        WIDTH=str(WIDTH),
        TRUTH_FILE=str(out / "truth" / "truth-{rank}.json"),
    )
    launch(env, name == "slowlink")
    analysed = run(
        [str(VENV_BIN / "tf-otel"), "analyze", str(out / "spans"), "--format", "json"], base_env()
    )
    truth = _truth(out / "truth")
    truth["arrival"] = _first_arrivals(out / "spans")
    return name, json.loads(analysed.stdout), truth, _roots(out / "spans")


def _first_arrivals(folder: Path) -> Dict[int, Dict[int, float]]:
    """step -> rank -> its first collective arrival (ms, rank 0's clock: on one machine, the
    same clock as the truth's), from the exported collective spans."""
    first: Dict[int, Dict[int, float]] = {}
    for span in file_spans(folder):
        attributes = span["attributes"]
        if attributes.get(record.ATTR_CATEGORY) != record.COLLECTIVE:
            continue
        at = first.setdefault(int(attributes[record.ATTR_STEP]), {})
        rank = int(span["rank"])
        at[rank] = min(at.get(rank, float("inf")), span["start_ns"] / 1e6)
    return first


@pytest.fixture(scope="module", params=["late", "input", "compute", "none", "slowlink"])
def scenario(request, runs) -> Run:
    return runs(request.param)


def _truth(folder: Path) -> Dict[str, Dict[int, Dict[int, float]]]:
    """kind (work, ready) -> step -> rank -> ms: the rank's own work before its gradient
    allreduce, and the wall-clock moment it was ready (the simulated hosts share the machine's
    clock, no skew injected here: one clock), in-process."""
    truth: Dict[str, Dict[int, Dict[int, float]]] = {"work": {}, "ready": {}}
    for path in folder.glob("truth-*.json"):
        data = json.loads(path.read_text())
        for kind in ("work", "ready"):
            for step, ns in data[f"{kind}_ns"].items():
                truth[kind].setdefault(int(step), {})[data["rank"]] = ns / 1e6
    return truth


def _roots(folder: Path) -> Dict[int, Dict[str, Any]]:
    """Step number -> the attributes of its root (rank 0 emits them, with its live verdict), read
    from the OTLP-JSON files as written (every attribute)."""
    roots = {}
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            for resource_spans in json.loads(line).get("resourceSpans", []) if line else []:
                for scope_spans in resource_spans.get("scopeSpans", []):
                    for span in scope_spans.get("spans", []):
                        attributes = attributes_dict(span.get("attributes"))
                        if attributes.get(record.ATTR_CATEGORY) == record.STEP_ROOT:
                            roots[int(attributes[record.ATTR_STEP])] = attributes
    return roots


def _beyond_others(values: Dict[int, float], rank: int) -> float:
    return values[rank] - statistics.median(v for r, v in values.items() if r != rank)


# an injected step is the slow rank's beyond doubt where the ranks' own truth has it ready
# later than every other rank by this much (the larger of the two)
CLEAR_MS, CLEAR_SHARE = 20.0, 0.25


def _clear_injection(ready: Dict[int, float]) -> bool:
    """Whether the slow rank was ready later than every other rank by a clear margin. A loaded
    host can delay another rank in the same step by about as much (seen once in CI: rank 1
    began step 5 70-84 ms late while rank 2 ran its big batch), and then naming that rank is
    right too, where the truth shows it late."""
    slow = _beyond_others(ready, SLOW_RANK)
    others = max(_beyond_others(ready, r) for r in ready if r != SLOW_RANK)
    return slow - others > max(CLEAR_MS, CLEAR_SHARE * slow)


def test_analysis_names_the_injected_stragglers_and_only_real_ones(scenario):
    name, report, truth, _ = scenario
    steps = {s["step"]: s for s in report["steps"]}
    assert len(steps) == STEPS, sorted(steps)
    assert 0 in report["summary"]["warmup_steps"]  # tracing the step function
    named = {n: s["straggler"] for n, s in steps.items() if s["straggler"]}
    context = json.dumps(
        {
            "named": named,
            "noise": report["summary"]["lateness_noise"],
            "threshold_ms": report["summary"]["straggler_threshold_ms"],
            "lateness_ms": {
                n: {r: round(_beyond_others(truth["ready"][n], r), 1) for r in truth["ready"][n]}
                for n in sorted(truth["ready"])
            },
        }
    )
    for step in steps.values():
        assert 0 <= step["what_if_ms"] <= step["duration_ms"], context
    injected = SLOW_STEPS if name in CAUSE else []  # none, slowlink: no rank is slowed
    for number, straggler in named.items():  # the host's own stragglers must be real ones
        if number not in injected:
            late = _beyond_others(truth["ready"][number], straggler["rank"])
            assert late >= 0.5 * straggler["excess_ms"], (number, context)
    if name not in CAUSE:
        return
    assert set(SLOW_STEPS) <= set(named), context
    clear = [n for n in SLOW_STEPS if _clear_injection(truth["ready"][n])]
    assert clear, context  # the injection made the slow rank the straggler beyond doubt
    for number in SLOW_STEPS:
        straggler = named[number]
        if number not in clear and straggler["rank"] != SLOW_RANK:
            late = _beyond_others(truth["ready"][number], straggler["rank"])
            assert late >= 0.5 * straggler["excess_ms"], (number, context)  # a real one
            continue
        assert straggler["rank"] == SLOW_RANK, context
        assert straggler["category"] == CAUSE[name], context
        # the delay as the ranks measured it in-process (a loaded host oversleeps a sleep):
        # the slow rank's extra work - but the step waited for it only as long as it was ready
        # later than the others' median, and delay_ms is bounded by that excess; when another
        # rank begins late or works slowly by itself in the same step (seen on the cluster:
        # rank 0 began step 12 13 ms late, rank 1 worked 14.5 ms instead of 3), the wall-clock
        # lateness is the smaller truth (87.2 ms extra work, 75.3 ms later ready: named 75.3)
        # the injection happened: a sleep never wakes early (against the others' median it
        # can read less: CI's loaded host slowed the other ranks' work by 15 ms in step 12)
        if name != "compute":
            assert truth["work"][number][SLOW_RANK] >= DELAY_MS, context
        work = _beyond_others(truth["work"][number], SLOW_RANK)
        expected = min(work, _beyond_others(truth["ready"][number], SLOW_RANK))
        assert abs(straggler["delay_ms"] - expected) <= 0.1 * expected, (expected, context)
        assert straggler["excess_ms"] <= steps[number]["duration_ms"]
    found = [f for f in report["findings"] if f["rule"] == "straggler"]
    finding = next(f for f in found if f["evidence"]["rank"] == SLOW_RANK)
    assert set(clear) <= set(finding["evidence"]["steps"]), context


def test_rank_0_names_the_injected_stragglers_live_on_the_step_roots(scenario):
    """Issue 27: rank 0's verdict on each root (cluster/verdicts.py), made while the job runs
    from what it gathers (every rank's extent and, with collective detail on every step, every
    rank's first collective arrival), names the slowed rank in the slowed steps with the cause
    (where the ranks' own in-process truth leaves no doubt who was late; where another rank was
    about as late, that rank if the truth shows it late); a root named beyond them is a real
    straggler, and the control and the slowed link name nobody else."""
    name, _, truth, roots = scenario
    assert sorted(roots) == list(range(STEPS))
    judged = [n for n, a in roots.items() if record.ATTR_STRAGGLER_THRESHOLD in a]
    assert judged and min(judged) <= min(SLOW_STEPS), sorted(judged)  # judged from step 5 on
    assert all(roots[n][record.ATTR_STRAGGLER_MEASURED] == "arrivals" for n in judged)
    named = {n: a for n, a in roots.items() if record.ATTR_STRAGGLER_RANK in a}
    verdicts = {
        n: (a[record.ATTR_STRAGGLER_RANK], a[record.ATTR_STRAGGLER_CATEGORY],
            round(a[record.ATTR_STRAGGLER_LATENESS] / 1e6, 1))
        for n, a in named.items()
    }  # fmt: skip
    context = json.dumps({"verdicts": verdicts, "judged": sorted(judged)})
    injected = SLOW_STEPS if name in CAUSE else []
    for number, attributes in named.items():  # the host's own stragglers must be real ones
        if number not in injected:
            rank = attributes[record.ATTR_STRAGGLER_RANK]
            late = _beyond_others(truth["ready"][number], rank)
            lateness_ms = attributes[record.ATTR_STRAGGLER_LATENESS] / 1e6
            assert late >= 0.5 * lateness_ms, (number, context)
    if name not in CAUSE:
        return
    assert set(SLOW_STEPS) <= set(named), context
    clear = [n for n in SLOW_STEPS if _clear_injection(truth["ready"][n])]
    assert clear, context  # the injection made the slow rank the straggler beyond doubt
    for number in SLOW_STEPS:
        attributes = named[number]
        rank = attributes[record.ATTR_STRAGGLER_RANK]
        if number not in clear and rank != SLOW_RANK:
            late = _beyond_others(truth["ready"][number], rank)
            assert late >= 0.5 * attributes[record.ATTR_STRAGGLER_LATENESS] / 1e6, context
            continue
        assert rank == SLOW_RANK, context
        assert attributes[record.ATTR_STRAGGLER_CATEGORY] == CAUSE[name], context
        # as the offline analysis: the slow rank's extra work, bounded by how much later than
        # the others' median it was ready (its first collective arrival)
        work = _beyond_others(truth["work"][number], SLOW_RANK)
        expected = min(work, _beyond_others(truth["ready"][number], SLOW_RANK))
        lateness_ms = attributes[record.ATTR_STRAGGLER_LATENESS] / 1e6
        # the verdict measures the first collective arrival, the truth the moment the gradients
        # were ready just before it; with 4 ranks on 2 cores the ops between the two take each
        # rank a varying time (CI: up to ~40 ms), which moves the lateness by the slow rank's
        # gap less the others': allowed where the exported arrivals show it, up to 10 % more
        ready, arrived = truth["ready"][number], truth["arrival"].get(number, {})
        gaps = {r: arrived[r] - ready[r] for r in ready if r in arrived}
        gap = abs(_beyond_others(gaps, SLOW_RANK)) if len(gaps) == len(ready) else 0.0
        allowed = 0.1 * expected + min(gap, 0.1 * expected)
        assert abs(lateness_ms - expected) <= allowed, (expected, gap, gaps, context)


def _steady(report: Dict[str, Any]) -> list:
    return [s for s in report["steps"] if not s["warmup"]]


def _median_ms(report: Dict[str, Any], category: str) -> float:
    return statistics.median(s["critical_path_by_category_ms"][category] for s in _steady(report))


def test_slowlink_raises_communication_by_the_link_cost_and_blames_no_rank(runs):
    """hostB's link at LINK_RATE against the control, both from this module's cluster.

    The link's cost per step: the gradients' ring allreduce (gloo, float32) sends 2 (N-1)/N of
    their bytes over each of the two links that cross hosts (2->1 out of hostB, 0->3 into it;
    each direction has its own tbf, so both run at the rate at once); on the wire a 1448-byte
    TCP segment (MTU 1500, timestamps) is a 1514-byte frame, which is what tbf counts. With
    50 mbit: 283.6 ms of payload, 296.5 ms on the wire.

    Tolerance, per step (medians over the steady steps): the rise of the path's communication
    is at least the payload's time minus the control's own communication (tbf lets no more
    through; the slow transfer replaces the control's fast one), and at most 2 x the wire
    cost: the ACKs of the other direction's data share each tbf (+2-5 %), and each allreduce
    (3 per step: with collective detail on, tf_otel's timing ops run the script's own
    hvd.allreduce calls one after another, docs/guides/HOROVOD.md limits) runs a reduce-scatter and
    then an allgather phase, each filling and draining gloo's two-segments-in-flight pipeline
    over 6 segment transfers per link (up to about +2/12). Measured: 1.16-1.27 x (5 runs), and
    1.54 x in CI on a loaded 2-core host. Neither tbf drops a packet (tc -s, printed by
    Cluster.slowed_link): the link idles while the ranks that feed it wait for a core. So the
    bound is 2 x the wire cost: a check that the injection is the one described (a link at half
    the rate or less falls outside it), not a claim of the product.
    That bound is on the step's rise, which is what the link costs the job. The path's
    communication can rise by more: compute that ran on the control's path (gradients of the
    early layers) now runs under the longer allreduces, so the path holds less compute and more
    communication (CI, 2026-11-25: step +373 ms, communication +395 ms, compute on the path
    34 -> 13 ms). So the communication rise is bounded by the step's rise plus the control's
    compute on the path, and the share is at least the control's steps' with the link's cost
    added (less 0.05), never more than 1.
    """
    _, control, _, _ = runs("none")
    _, slowed, _, _ = runs("slowlink")
    payload = 2 * (RANKS - 1) / RANKS * GRADIENT_BYTES
    rate_bps = float(LINK_RATE.removesuffix("mbit")) * 1e6
    floor_ms = payload * 8 / rate_bps * 1000
    cost_ms = floor_ms * 1514 / 1448
    both = {"none": control, "slowlink": slowed}
    comm = {n: _median_ms(r, "communication") for n, r in both.items()}
    step = {n: statistics.median(s["duration_ms"] for s in _steady(r)) for n, r in both.items()}
    share = {n: r["summary"]["critical_path_share"]["communication"] for n, r in both.items()}
    rise = comm["slowlink"] - comm["none"]
    # the share the control's steps would have with the link's cost added to them
    expected_share = (comm["none"] + cost_ms) / (step["none"] + cost_ms)
    named = {s["step"]: s["straggler"] for s in slowed["steps"] if s["straggler"]}
    rules = [f["rule"] for f in slowed["findings"]]
    context = json.dumps(
        {
            "cost_ms": round(cost_ms, 1),
            "rise_ms": round(rise, 1),
            "step_rise_ms": round(step["slowlink"] - step["none"], 1),
            "comm_ms": comm,
            "step_ms": step,
            "share": share,
            "expected_share": round(expected_share, 3),
            "named": named,
            "findings": [(f["rule"], f["summary"]) for f in slowed["findings"]],
        }
    )
    print(context)
    step_rise = step["slowlink"] - step["none"]
    assert floor_ms - comm["none"] <= step_rise <= 2.0 * cost_ms, context
    assert floor_ms - comm["none"] <= rise <= step_rise + (step["none"] - comm["none"]), context
    assert expected_share - 0.05 <= share["slowlink"] <= 1.0, context
    assert "communication_bound" in rules, context
    # no rank is blamed for the link: no step's straggler is its communication, no rank is
    # late throughout (stragglers of the host's own noise are checked by the test above)
    assert not [n for n, s in named.items() if s["category"] == "communication"], context
    assert "persistent_lateness" not in rules, context
