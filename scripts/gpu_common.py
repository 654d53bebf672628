"""What scripts/gpu_check.py and scripts/gpu_tf_check.py share: their log lines, their JSON
outputs and free loopback ports.

Usage (a script in scripts/, whose folder is on sys.path when it runs)::

    from gpu_common import free_port, log, write_json
    log("probe", result)                 # "[gpu_tf_check] probe ..." (the running script's name)
    write_json(out / "probe.json", info)
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any


def log(*a: Any) -> None:
    print(f"[{Path(sys.argv[0]).stem}]", *a, flush=True)


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, sort_keys=True, default=str))
    log("wrote", path, path.stat().st_size, "bytes")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
