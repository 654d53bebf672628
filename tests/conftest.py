"""Shared fixtures: the real OTLP receiver and a helper to run training scripts as subprocesses."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple, Union

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from otlp_receiver import OtlpReceiver  # noqa: E402

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


def free_ports(n: int = 1) -> List[int]:
    """n distinct ports free on 127.0.0.1 right now (held together while picked)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port_pair() -> int:
    """A coordinator port p with p + 1 (rank 0's clock service) also free, both held while picked.

    Chosen below the kernel's ephemeral range, so a process's outgoing connections (the ranks'
    OTLP clients, Gloo) cannot take p + 1 between the pick and the job binding it.
    """
    low, _ = _ephemeral_range()
    for _ in range(200):
        port = random.randrange(20000, max(20002, low - 2))
        a, b = socket.socket(), socket.socket()
        try:
            a.bind(("127.0.0.1", port))
            b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
        finally:
            a.close()
            b.close()
    raise RuntimeError("no two adjacent free ports on 127.0.0.1")


def _ephemeral_range() -> Tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def example(name: str) -> str:
    return str(EXAMPLES / name)


def python() -> str:
    return str(VENV_BIN / "python")


def optional(value: Optional[str]) -> str:
    return value or ""
