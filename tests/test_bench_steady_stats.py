"""The in-process steady bench's readings (bench/bench_real_model.py --inprocess): blocks read
against the untraced blocks either side of them find a known cost on a machine that drifts, an
A/A control reads 1, and a stalled block does not move the trimmed mean.

No bench runs here: the readings are fed step times built with a known cost, a drift and noise.

Run: ``.venv/bin/python -m pytest tests/test_bench_steady_stats.py -q``
"""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path
from typing import List, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import bench_real_model as brm  # noqa: E402
import harness  # noqa: E402

MODES = ["untraced", "untraced_aa", "coll_1in20"]
BLOCK = 4


def _job(cost: float, drift: float, noise: float, rounds: int = 40, seed: int = 3) -> dict:
    """One rank's result as worker_inprocess reports it, its blocks in the bench's own order
    (harness.interleaved), each block's steps slowed by the machine's drift (linear over the
    job) and, for coll_1in20, by ``cost``."""
    rng = random.Random(seed)
    order: List[str] = []
    cpu: List[float] = []
    n_blocks = rounds * len(MODES)

    def block(_round_no: int, mode: str) -> List[int]:
        slow = 1 + drift * len(order) / n_blocks
        factor = slow * (1 + cost if mode == "coll_1in20" else 1)
        steps = [int(1e8 * factor * (1 + rng.gauss(0, noise))) for _ in range(BLOCK)]
        order.append(mode)
        cpu.append(sum(steps) / 1e9)
        return steps

    blocks = harness.interleaved(MODES, rounds, block, reverse_odd=True)
    times = {mode: [ns for steps in runs for ns in steps] for mode, runs in blocks.items()}
    return {"rank": 0, "times": times, "order": order, "cpu": cpu}


def _reading(lines: List[str], mode: str) -> Tuple[float, float, float]:
    text = " ".join(lines)
    match = re.search(rf"{mode} ?([\d.]+)× \(([\d.]+)-([\d.]+), n=\d+\)", text)
    assert match, text
    mean, low, high = (float(g) for g in match.groups())
    return mean, low, high


def test_bracketed_blocks_find_a_known_cost_on_a_drifting_machine() -> None:
    # 20 jobs with different noise: the readings centre on the truth and their 95 % intervals
    # hold it in most jobs (a few misses are what 95 % means)
    costs, controls, hits, aa_hits = [], [], 0, 0
    for seed in range(20):
        lines = brm.bracketed_blocks([_job(cost=0.03, drift=0.3, noise=0.01, seed=seed)], BLOCK)
        mean, low, high = _reading(lines, "coll_1in20")
        assert high < 0.99, lines  # a 3 % cost is resolved, not read as noise
        costs.append(mean)
        hits += low <= 1 / 1.03 <= high
        aa_mean, aa_low, aa_high = _reading(lines, "untraced_aa")
        assert aa_high - aa_low < 0.01, lines
        controls.append(aa_mean)
        aa_hits += aa_low <= 1.0 <= aa_high
    assert abs(sum(costs) / 20 - 1 / 1.03) < 0.001, costs
    assert abs(sum(controls) / 20 - 1.0) < 0.001, controls
    assert hits >= 16 and aa_hits >= 16, (hits, aa_hits)


def test_control_with_no_cost_reads_one() -> None:
    for cpu in (False, True):
        lines = brm.bracketed_blocks([_job(cost=0.0, drift=0.3, noise=0.01, seed=8)], BLOCK, cpu)
        for mode in ("untraced_aa", "coll_1in20"):
            _, low, high = _reading(lines, mode)
            assert low <= 1.0 <= high, (cpu, lines)


def test_a_stalled_block_does_not_move_the_trimmed_mean() -> None:
    ratios = [1.0 + 0.001 * (i % 5 - 2) for i in range(40)]
    clean = _reading([brm._trimmed_mean_ci(ratios)], "")
    stalled = _reading([brm._trimmed_mean_ci(ratios[:-1] + [0.2])], "")
    assert abs(stalled[0] - clean[0]) < 0.001, (clean, stalled)
    assert stalled[1] > 0.99, stalled


def test_too_few_blocks_give_no_interval() -> None:
    assert brm._trimmed_mean_ci([1.0, 1.01]) == "-"
    assert brm._median_ci([]) == "-"


def test_a_steady_drift_alone_reads_as_no_cost() -> None:
    # rotation leaves the untraced blocks unevenly around a block: read against their plain
    # mean, a machine slowing by 30 % over the job would read as a cost or a gain
    lines = brm.bracketed_blocks([_job(cost=0.0, drift=0.3, noise=0.0)], BLOCK)
    for mode in ("untraced_aa", "coll_1in20"):
        mean, low, high = _reading(lines, mode)
        assert abs(mean - 1.0) < 0.0002 and high - low < 0.0005, lines
