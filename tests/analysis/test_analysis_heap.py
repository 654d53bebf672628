"""analysis.load.heap: glibc's thresholds held in a decoding process, once, and never over a
setting the environment made (each case in a fresh interpreter: the hold lasts a process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = (
    "from tf_otel.analysis.load.heap import hold_block_buffers; "
    "print(hold_block_buffers(), hold_block_buffers())"
)


def _run(env: dict) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux")
def test_the_thresholds_are_held_once_in_a_glibc_process() -> None:
    assert _run({}) == "True True"


@pytest.mark.parametrize(
    "setting",
    [
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"MALLOC_TRIM_THRESHOLD_": "0"},
        {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"},
    ],
)
def test_a_threshold_the_environment_set_is_left_as_set(setting: dict) -> None:
    assert _run(setting) == "False False"


def test_the_spill_holds_them_where_it_decodes(tmp_path, monkeypatch) -> None:
    """``spill_part`` asks for the hold in the process that decodes (a Dask worker too)."""
    from tf_otel.analysis.load import spill

    asked = []
    monkeypatch.setattr(spill, "hold_block_buffers", lambda: asked.append(True) or True)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import bench_analysis

    bench_analysis.generate(tmp_path, steps=1, ranks=1)
    spill.spill_part(((tmp_path / "rank0.jsonl", 0, -1), str(tmp_path / "0.spill"), True))
    assert asked == [True]
