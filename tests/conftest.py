"""Shared fixtures: the real OTLP receiver and a helper to run training scripts as subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Union

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from otlp_receiver import OtlpReceiver  # noqa: E402
from ports import free_port_pair, free_ports  # noqa: E402, F401  (tests import them from here)

VENV_BIN = Path(sys.executable).parent
EXAMPLES = REPO / "examples"


def base_env(**extra: str) -> Dict[str, str]:
    """The environment of a traced subprocess: venv first on PATH, no inherited OTEL_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TF_OTEL_"))}
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_btl_vader_single_copy_mechanism="none",
        OMPI_MCA_rmaps_base_oversubscribe="1",
    )
    env.update(extra)
    return env


def run(
    command: Union[str, List[str]],
    env: Dict[str, str],
    timeout: float = 300,
    check: bool = True,
) -> subprocess.CompletedProcess:
    if isinstance(command, str):
        command = command.split()
    result = subprocess.run(
        command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
            f"\n--- stderr\n{result.stderr[-6000:]}"
        )
    return result


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


def horovodrun(
    script: str, env: Dict[str, str], backend: str = "gloo", np: int = 2, timeout: float = 300
) -> subprocess.CompletedProcess:
    command = [
        str(VENV_BIN / "horovodrun"),
        "-np",
        str(np),
        "-H",
        f"localhost:{np}",
        f"--{backend}",
        str(VENV_BIN / "python"),
        str(EXAMPLES / script),
    ]
    return run(command, env, timeout)


def example(name: str) -> str:
    return str(EXAMPLES / name)


def python() -> str:
    return str(VENV_BIN / "python")


def optional(value: Optional[str]) -> str:
    return value or ""
