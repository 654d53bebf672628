"""Write the fixed trace files and the expected ``tf-otel analyze --format json`` outputs.

Usage (only when analysis output is meant to change; commit the result with the change)::

    .venv/bin/python tests/analysis/golden/make_golden.py            # rewrite expected outputs
    .venv/bin/python tests/analysis/golden/make_golden.py --inputs   # also regenerate the inputs

Inputs: ``synth`` (bench_analysis's generator, 12 steps x 4 ranks, rank 1 late on steps 0
and 10), ``perturbed`` (the same with rank 2 skewed by 3 ms on odd steps so causality is
repaired, some spans dropped or duplicated, rank 3 missing from step 5) and ``demo`` (a real
2-rank Horovod run of examples/horovod_tape.py with an 80 ms straggler on rank 1).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CASES = ("synth", "perturbed", "demo")
FLAGS = ("--format", "json", "--with-path")


def analyze(case: str) -> bytes:
    """The exact bytes ``tf-otel analyze`` prints for one case."""
    return subprocess.run(
        # Relative path and cwd: the report names its source, and that must not depend on
        # where the checkout lives.
        [sys.executable, "-m", "tf_otel.cli", "analyze", case, *FLAGS],
        check=True,
        capture_output=True,
        cwd=HERE,
    ).stdout


def _write_gz(path: Path, lines: list[str]) -> None:
    # mtime=0 so the same rows give the same bytes.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
        out.write("".join(lines).encode())


def _perturb(line: str, index: int) -> list[str]:
    doc = json.loads(line)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            kept = []
            for span in ss["spans"]:
                attrs = {a["key"]: a["value"] for a in span["attributes"]}
                rank = int(attrs["tf_otel.rank"]["intValue"])
                step = int(attrs["tf_otel.step"]["intValue"])
                if rank == 3 and step == 5:
                    continue
                if rank == 2 and step % 2 == 1:
                    for key in ("startTimeUnixNano", "endTimeUnixNano"):
                        span[key] = str(int(span[key]) + 3_000_000)
                h = int(span["spanId"][:6], 16)
                if h % 97 == 0 and span["name"] != "train_function":
                    continue
                kept.append(span)
                if h % 89 == 0:
                    kept.append(span)
            ss["spans"] = kept
    return [json.dumps(doc, separators=(",", ":")) + "\n"]


def make_inputs() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import tempfile

    import bench_analysis  # type: ignore[import-not-found]

    with tempfile.TemporaryDirectory() as tmp:
        bench_analysis.generate(Path(tmp), steps=12, ranks=4, job="golden-job")
        for src in sorted(Path(tmp).glob("*.jsonl")):
            lines = src.read_text().splitlines(keepends=True)
            (HERE / "synth").mkdir(exist_ok=True)
            (HERE / "perturbed").mkdir(exist_ok=True)
            _write_gz(HERE / "synth" / f"{src.name}.gz", lines)
            out: list[str] = []
            for i, line in enumerate(lines):
                out.extend(_perturb(line, i))
            _write_gz(HERE / "perturbed" / f"{src.name}.gz", out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", action="store_true", help="regenerate synth/ and perturbed/")
    args = parser.parse_args()
    if args.inputs:
        make_inputs()
    for case in CASES:
        (HERE / f"{case}.expected.json").write_bytes(analyze(case))
        print(f"wrote {case}.expected.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
