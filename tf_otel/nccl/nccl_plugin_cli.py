"""``tf-otel nccl-plugin``: build the NCCL profiler plugin from the sources the package ships.

Usage::

    tf-otel nccl-plugin                      # -> the package's plugin/ folder, else the cache
    tf-otel nccl-plugin --out /opt/lib/libnccl-profiler-tf_otel.so
    TF_OTEL_NCCL_PROFILER=1 python train.py  # then finds it in either default place

Runs the package's ``plugin/build.sh`` (a C compiler, ``$CC`` or gcc; the profiler ABI is
vendored; where ``nccl.h`` is found it is also compiled against it as a check). Exit status:
the build's (0 with a "skipped:" line where no compiler is found).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tf_otel import cli_args
from tf_otel.nccl.plugin_files import BUILD_SCRIPT, PLUGIN_NAME, SOURCES, cache_path


def _default_out() -> Path:
    return SOURCES / PLUGIN_NAME if os.access(SOURCES, os.W_OK) else cache_path()


def add_parser(subparsers: Any) -> None:
    parser = cli_args.subcommand(
        subparsers,
        "nccl-plugin",
        "build the NCCL profiler plugin (per-collective NCCL timings)",
        __doc__,
        epilog=False,
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"the shared library to write (default: {SOURCES / PLUGIN_NAME} where writable, "
        f"else {cache_path()})",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out: Path = args.out or _default_out()
    if out.exists() and out.is_dir():
        print(f"tf-otel nccl-plugin: --out {out} is a folder: name the .so", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("PYTHON", sys.executable)  # whose site-packages may hold nvidia-nccl's nccl.h
    return subprocess.run(["bash", str(BUILD_SCRIPT), str(out)], env=env).returncode
