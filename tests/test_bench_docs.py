"""The benches rewrite only the generated section of their docs/benchmarks/<area>.md: a rerun
replaces the measured tables between the bench's two markers (bench/harness.py,
``write_generated``) and keeps the hand-written analysis around them.

No bench runs here: each bench's own doc writer is imported (importing a bench loads neither
TensorFlow nor Horovod, checked in a fresh interpreter) and called on a copy of the real doc.

Run: ``.venv/bin/python -m pytest tests/test_bench_docs.py -q``
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, List, Tuple

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
DOCS = REPO / "docs" / "benchmarks"
sys.path.insert(0, str(BENCH))

import harness  # noqa: E402

# (bench module, its doc writer, the name on its markers, the docs in docs/benchmarks/ it writes)
WRITERS: List[Tuple[str, str, str, List[str]]] = [
    ("bench_arrivals", "write_doc", "bench_arrivals", ["arrivals.md"]),
    ("bench_clock", "write_doc", "bench_clock", ["clock.md"]),
    ("bench_faults", "write_doc", "bench_faults", ["faults.md"]),
    ("bench_ops", "write_doc", "bench_ops", ["ops.md"]),
    (
        "bench_real_model",
        "write_doc",
        "bench_real_model",
        [
            "real_model.md",
            "real_model_second.md",
            "real_model_steady.md",
        ],
    ),
    (
        "bench_real_model",
        "write_inprocess_doc",
        "bench_real_model_inprocess",
        ["real_model.md", "steady.md"],
    ),
    ("bench_rank0", "write_doc", "bench_rank0", ["rank0.md"]),
    ("bench_startup", "write_doc", "bench_startup", ["startup.md"]),
    ("bench_step_metrics", "write_doc", "bench_step_metrics", ["step_metrics.md"]),
    ("bench_steps", "write_doc", "bench_steps", ["steps.md"]),
    (
        "bench_steps_inprocess",
        "write_doc",
        "bench_steps_inprocess",
        ["steps_inprocess.md"],
    ),
    (
        "bench_tf_collectives",
        "write_doc",
        "bench_tf_collectives",
        ["tf_collectives.md", "mirrored.md"],
    ),
    ("bench_trees", "write_doc", "bench_trees", ["trees.md"]),
    ("bench_verdicts", "write_doc", "bench_verdicts", ["verdicts.md"]),
]
CASES = [
    pytest.param(module, writer, name, doc, id=f"{module}.{writer}-{doc}")
    for module, writer, name, docs in WRITERS
    for doc in docs
]
NEW = "| new | table |\n|---|---|\n| 1 | 2.000 |\n\nLast run: a new one."


def _writer(module: str, writer: str) -> Callable[..., None]:
    return getattr(importlib.import_module(module), writer)


def _split(text: str, name: str) -> Tuple[str, str, str]:
    """(the file up to its begin marker, the section between the markers, from the end marker)."""
    begin, end = harness.generated_markers(name)
    head, _, rest = text.partition(begin + "\n")
    section, _, tail = rest.partition("\n" + end)
    return head, section, end + tail


@pytest.mark.parametrize("module, writer, name, doc", CASES)
def test_the_doc_holds_one_pair_of_its_bench_markers(
    module: str, writer: str, name: str, doc: str
) -> None:
    text = (DOCS / doc).read_text()
    begin, end = harness.generated_markers(name)
    assert text.count(begin) == 1 and text.count(end) == 1, doc
    assert text.index(begin) < text.index(end), doc
    lines = text.splitlines()
    assert begin in lines and end in lines, f"{doc}: a marker not on a line of its own"
    assert "<!-- table -->" not in text and "<!-- inprocess -->" not in text  # the old markers


@pytest.mark.parametrize("module, writer, name, doc", CASES)
def test_a_rerun_replaces_the_section_and_keeps_the_hand_written_text(
    module: str, writer: str, name: str, doc: str, tmp_path: Path
) -> None:
    head, section, tail = _split((DOCS / doc).read_text(), name)
    # hand-written text right beside the markers, where a whole-file rewrite would lose it
    head += "A hand-written line above the section.\n\n"
    tail = tail.replace("\n", "\n\nA hand-written line below the section.\n", 1)
    begin = harness.generated_markers(name)[0]
    copy = tmp_path / doc
    copy.write_text(head + begin + "\n" + section + "\n" + tail)

    _writer(module, writer)(copy, NEW)

    assert _split(copy.read_text(), name) == (head, NEW, tail)


@pytest.mark.parametrize("module, writer, name, doc", CASES)
def test_writing_the_section_back_leaves_the_doc_as_it_is(
    module: str, writer: str, name: str, doc: str, tmp_path: Path
) -> None:
    """The markers sit where the bench's writer puts them: its own section, written again, gives
    the same bytes (no blank line gained or lost around the markers)."""
    text = (DOCS / doc).read_text()
    copy = tmp_path / doc
    copy.write_text(text)
    _writer(module, writer)(copy, _split(text, name)[1])
    assert copy.read_text() == text


@pytest.mark.parametrize("module, writer, name, doc", CASES)
def test_a_new_doc_gets_the_section(
    module: str, writer: str, name: str, doc: str, tmp_path: Path
) -> None:
    path = tmp_path / doc
    _writer(module, writer)(path, NEW)
    text = path.read_text()
    assert text.startswith("# ")
    assert _split(text, name)[1] == NEW


def test_every_generated_section_in_the_docs_is_one_a_bench_above_writes() -> None:
    """A page of docs/benchmarks/ holding a bench's markers is listed above (so a move or a new
    page cannot leave its bench writing elsewhere), and each listed page is where
    harness.RESULTS, the benches' default, puts it."""
    assert harness.RESULTS == DOCS
    listed = {(name, doc) for _, _, name, docs in WRITERS for doc in docs}
    found = {
        (marker, page.name)
        for page in DOCS.glob("*.md")
        for marker in re.findall(r"^<!-- (\S+): generated from here", page.read_text(), re.M)
    }
    assert found == listed, (sorted(found - listed), sorted(listed - found))


def test_steps_inprocess_append_adds_to_the_runs_in_the_section(tmp_path: Path) -> None:
    """--append: the new run after the runs already in the section; the rest of the file kept."""
    doc = "steps_inprocess.md"
    name = "bench_steps_inprocess"
    text = (DOCS / doc).read_text() + "\nA hand-written reading of the runs.\n"
    copy = tmp_path / doc
    copy.write_text(text)
    head, section, tail = _split(text, name)

    _writer("bench_steps_inprocess", "write_doc")(copy, NEW, append=True)

    assert _split(copy.read_text(), name) == (head, section + "\n\n" + NEW, tail)


def test_importing_the_benches_loads_no_tensorflow_or_horovod() -> None:
    """In a fresh interpreter: what this test imports to reach the writers stays light."""
    modules = sorted({module for module, _, _, _ in WRITERS})
    code = (
        f"import sys; sys.path.insert(0, {str(BENCH)!r})\n"
        f"import {', '.join(modules)}\n"
        "heavy = [m for m in ('tensorflow', 'horovod', 'tf_keras', 'keras') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
