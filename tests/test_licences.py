"""No AGPL code is built or linked by the project's tooling or tests; the native decoder's
crates are all permissively licensed.

    .venv/bin/pytest -q tests/test_licences.py      (the binary check needs `make tools`)

Grafana Loki, Tempo and Grafana itself are AGPL-3.0: docker-compose.yml may pull their images for
users who choose them (docs/LICENSES.md), but no build script, collector manifest or Go binary of
ours may contain their modules. The binaries are read with `go version -m`, which lists every
module linked into a Go executable.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

try:  # tests/ as a package (repository root on sys.path) or as pytest's rootdir-less folder
    from tests.backends import REPO, collector_binary, jaeger_binary, prometheus_binary
except ImportError:
    from backends import (  # type: ignore[no-redef]
        REPO,
        collector_binary,
        jaeger_binary,
        prometheus_binary,
    )

AGPL_MODULES = re.compile(r"github\.com/grafana/(loki|tempo|grafana)(/|\s|$)")


def go() -> str:
    found = shutil.which("go") or "/usr/local/go/bin/go"
    assert Path(found).exists(), "Go is needed to read the binaries' module lists"
    return found


def linked_modules(binary: Path) -> list[str]:
    out = subprocess.run(
        [go(), "version", "-m", str(binary)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return [
        line.split()[1] for line in out.stdout.splitlines() if line.split()[:1] in (["dep"], ["=>"])
    ]


def test_the_pattern_finds_agpl_modules_and_only_those():
    assert AGPL_MODULES.search("github.com/grafana/loki/v3 v3.5.0")
    assert AGPL_MODULES.search("github.com/grafana/tempo v2.8.1")
    assert not AGPL_MODULES.search("github.com/grafana/regexp v0.0.0")  # BSD, used by Prometheus
    assert not AGPL_MODULES.search("github.com/grafana/pyroscope-go v1.2.0")


def test_build_files_name_no_agpl_module():
    files = [
        REPO / "scripts" / "build_go_tools.sh",
        REPO / "collector-config" / "builder-manifest.yaml",
        REPO / "Makefile",
    ]
    for path in files:
        hits = [line for line in path.read_text().splitlines() if AGPL_MODULES.search(line)]
        assert not hits, f"{path.name} names an AGPL module: {hits}"


def test_built_binaries_link_no_agpl_module():
    binaries = [jaeger_binary(), collector_binary(), prometheus_binary()]
    for binary in binaries:
        modules = linked_modules(binary)
        assert len(modules) > 20, f"{binary}: no module list read ({modules[:3]})"
        bad = [m for m in modules if AGPL_MODULES.search(m + " ")]
        assert not bad, f"{binary.name} links AGPL modules: {bad}"


PERMISSIVE = re.compile(r"\b(MIT|Apache-2\.0|BSD-[23]-Clause|ISC|Zlib|Unicode-3\.0|BSL-1\.0)\b")


def test_native_decoders_crates_offer_a_permissive_licence():
    """Every crate native/Cargo.lock may build into tf_otel_native is offered under a permissive
    licence (read from the crates' own manifests, offline: make install fetched them)."""
    cargo = shutil.which("cargo")
    if cargo is None:  # no Rust toolchain: nothing of native/ is built (install.sh says so)
        return
    found = subprocess.run(
        [cargo, "metadata", "--offline", "--format-version", "1", "--locked"],
        cwd=REPO / "native",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.returncode == 0, found.stderr[-2000:]
    packages = json.loads(found.stdout)["packages"]
    assert len(packages) > 20 and any(p["name"] == "pyo3" for p in packages)
    bad = [
        f"{p['name']} {p['version']}: {p.get('license')}"
        for p in packages
        if not PERMISSIVE.search(p.get("license") or "") or "AGPL" in (p.get("license") or "")
    ]
    assert not bad, f"crates without a permissive licence: {bad}"
