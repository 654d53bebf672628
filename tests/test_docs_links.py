"""The docs' links and paths lead somewhere: every relative markdown link in README.md,
CONTRIBUTING.md, CHANGELOG.md and docs/ names a file that exists, every ``docs/...`` path named
in the code, tests, scripts and docs exists, and the two indexes list every page under them
(docs/BENCHMARKS.md: docs/benchmarks/; docs/guides/README.md: docs/guides/).

Run: ``.venv/bin/python -m pytest tests/test_docs_links.py -q``
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import List, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")
# a repository path into docs/ named in prose, a docstring or a command line
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w/.-]*\w\.(?:md|png)")
# docs/ paths of other projects, named where their conventions are followed
ELSEWHERE = {"docs/hardware/gpu.md"}  # OpenTelemetry semantic conventions (metrics/gpu_metrics)
TEXT = (".py", ".md", ".sh", ".c", ".yaml", ".yml", ".toml", ".cfg")


def _markdown() -> List[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "CHANGELOG.md"] + sorted(
        DOCS.rglob("*.md")
    )


def _tracked_text() -> List[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [
        REPO / f
        for f in listed
        if (f.endswith(TEXT) or Path(f).name == "Makefile") and (REPO / f).is_file()
    ]


def _links(path: Path) -> List[Tuple[int, str]]:
    """(line number, target) of each relative link in the file, its anchor left off."""
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            found.append((number, target.partition("#")[0]))
    return found


@pytest.mark.parametrize("path", _markdown(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_names_a_file_that_exists(path: Path) -> None:
    broken = [
        f"{path.relative_to(REPO)}:{number}: {target}"
        for number, target in _links(path)
        if not (path.parent / target).exists()
    ]
    assert not broken, "\n".join(broken)


def test_every_docs_path_named_in_the_repository_exists() -> None:
    broken = []
    for path in _tracked_text():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for named in DOCS_PATH.findall(line):
                if named not in ELSEWHERE and not (REPO / named).exists():
                    broken.append(f"{path.relative_to(REPO)}:{number}: {named}")
    assert not broken, "\n".join(broken)


def _linked_from(index: Path) -> Set[Path]:
    return {(index.parent / target).resolve() for _, target in _links(index)}


def test_the_benchmarks_index_links_every_results_page() -> None:
    pages = {p.resolve() for p in (DOCS / "benchmarks").glob("*.md")}
    assert pages, "docs/benchmarks/ is empty"
    missing = pages - _linked_from(DOCS / "BENCHMARKS.md")
    assert not missing, f"docs/BENCHMARKS.md does not link {sorted(p.name for p in missing)}"


def test_the_guides_reading_order_names_every_guide() -> None:
    index = DOCS / "guides" / "README.md"
    guides = {p.resolve() for p in (DOCS / "guides").glob("*.md")} - {index.resolve()}
    assert guides, "docs/guides/ holds no guide"
    missing = guides - _linked_from(index)
    assert not missing, f"docs/guides/README.md does not link {sorted(p.name for p in missing)}"


def test_docs_holds_only_the_indexes_and_the_named_pages() -> None:
    """Results go to docs/benchmarks/, guides to docs/guides/: no page grows back beside them."""
    flat = sorted(p.name for p in DOCS.glob("*") if p.is_file())
    assert flat == ["ARCHITECTURE.md", "BENCHMARKS.md", "LICENSES.md"], flat
