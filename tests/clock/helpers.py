"""Shared helpers for the multi-process clock tests (real processes, real TCP)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

from ports import free_port_pair

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"


def env_with_path(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_OTEL_", "HOROVOD_"))}
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra or {})
    return env


def run_pair(
    test_clock: str = "",
    duration: float = 2.0,
    exchanges: int = 64,
    interval: float = 0.5,
    rank_env: Optional[Dict[int, Dict[str, str]]] = None,
    timeout: float = 60.0,
    min_probes: int = 0,
) -> Dict:
    """Rank 0 and rank 1 of tf_otel.clock.pair over TCP on 127.0.0.1; rank 1's JSON result."""
    port = free_port_pair()
    procs: List[subprocess.Popen] = []
    for rank in (0, 1):
        env = env_with_path(
            {
                "HOROVOD_RANK": str(rank),
                "HOROVOD_SIZE": "2",
                "HOROVOD_LOCAL_RANK": str(rank),
                "HOROVOD_LOCAL_SIZE": "2",
                "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
                "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
                "TF_OTEL_COORDINATOR": f"127.0.0.1:{port}",
                "TF_OTEL_TEST_CLOCK": test_clock,
            }
        )
        env.update((rank_env or {}).get(rank, {}))
        cmd = [sys.executable, "-m", "tf_otel.clock.pair", "--duration", str(duration)]
        cmd += ["--exchanges", str(exchanges), "--interval", str(interval)]
        cmd += ["--min-probes", str(min_probes)]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outs = [p.communicate(timeout=timeout) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"rc={p.returncode}\n{out}\n{err}"
    return json.loads(outs[1][0].strip().splitlines()[-1])


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
