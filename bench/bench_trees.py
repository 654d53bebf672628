"""The runtime before and after a change, side by side: each bench below run alternately in this
working tree and in a git worktree of ``--base`` (fresh processes, the trees' order rotated
each round), so a restructuring's cost reads against the spread of each tree's own repeats
(the A/A: a tree's runs compared with each other).

    .venv/bin/python bench/bench_trees.py --base ed5387a --rounds 5
    .venv/bin/python bench/bench_trees.py --base HEAD~3 --benches step_context --doc

Benches (each the tree's own copy of the script, so an API the change renamed is read the way
that tree wrote it):

  step_context  the training thread's step wrapper with the step-context hook, µs a step
                (bench_step_context.py: no TensorFlow)
  detail_cpu    rank 0's CPU for a collective-detail step of 158 tensors: the runtime, the
                stamps' exchange, span building and the file export, ms a step
                (bench_detail_cpu.py)

Prints each tree's median and range, the ratio after / before, and each tree's A/A (its largest
run over its smallest). ``--doc``: writes them into docs/benchmarks/trees.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List

import harness

REPO = Path(__file__).resolve().parent.parent
DOC = harness.RESULTS / "trees.md"


def _step_context(out: str) -> float:
    found = re.search(r"run_step with the hook:\s+([0-9.]+) us/step", out)
    if found is None:
        raise RuntimeError(f"no step time in:\n{out[-2000:]}")
    return float(found.group(1))


def _detail_cpu(out: str) -> float:
    return float(json.loads(out.strip().splitlines()[-1])["cpu_ms_per_detail_step"])


# name -> (script and arguments, how to read its one figure, unit)
BENCHES: Dict[str, tuple] = {
    "step_context": (["bench/bench_step_context.py", "--rounds", "5"], _step_context, "µs/step"),
    "detail_cpu": (["bench/bench_detail_cpu.py", "--steps", "30"], _detail_cpu, "ms/step"),
}


def worktree(base: str) -> Path:
    """A detached worktree of ``base`` (made once, kept under the temp dir for reruns)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", base], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"tf_otel-tree-{commit}"
    if not (path / "tf_otel").is_dir():
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(path), commit],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
    return path


def run_in(tree: Path, argv: List[str], read: Callable[[str], float]) -> float:
    """One fresh process of ``argv`` with ``tree`` first on the path (its own tf_otel)."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [sys.executable, *argv], cwd=tree, env=env, capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"{argv} in {tree} failed:\n{done.stderr[-3000:]}")
    return read(done.stdout)


def write_doc(path: Path, text: str) -> None:
    """``text`` as the generated section of the doc at ``path``; the rest of the file stays."""
    harness.write_generated(path, "bench_trees", text, "The runtime before and after a change")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit before the change")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--benches", default=",".join(BENCHES))
    parser.add_argument("--doc", action="store_true", help=f"write {DOC.name}'s section")
    args = parser.parse_args()
    names = [n for n in args.benches.split(",") if n]
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        parser.error(f"--benches: unknown {unknown}; known: {sorted(BENCHES)}")
    trees = {"before": worktree(args.base), "after": REPO}
    lines = [
        f"`--base {args.base}` against the working tree, {args.rounds} rounds, the trees' order "
        f"rotated each round; load average at the start {os.getloadavg()[0]:.1f}",
        "",
        "| bench | before (median, range) | after (median, range) | after / before "
        "| A/A before | A/A after |",
        "|---|---|---|---:|---:|---:|",
    ]
    for name in names:
        argv, read, unit = BENCHES[name]

        def one(
            round_no: int, tree: str, argv: List[str] = argv, read=read, name: str = name
        ) -> float:
            value = run_in(trees[tree], argv, read)
            print(f"{name} round {round_no + 1} {tree}: {value:.2f}", flush=True)
            return value

        results = harness.interleaved(list(trees), args.rounds, one)
        before, after = results["before"], results["after"]
        med_b, med_a = statistics.median(before), statistics.median(after)
        lines.append(
            f"| {name} ({unit}) | {med_b:.2f} ({min(before):.2f}-{max(before):.2f}) "
            f"| {med_a:.2f} ({min(after):.2f}-{max(after):.2f}) | {med_a / med_b:.3f} "
            f"| {max(before) / min(before):.3f} | {max(after) / min(after):.3f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.doc:
        write_doc(DOC, text)


if __name__ == "__main__":
    main()
