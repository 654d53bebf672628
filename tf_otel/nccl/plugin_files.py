"""Where the NCCL profiler plugin's sources, build and built library are.

Usage::

    SOURCES / PLUGIN_NAME     # built beside its sources (a clone, a writable install)
    cache_path()              # else in the user's cache (``tf-otel nccl-plugin``)

Plain paths only: the training process reads them (``instrument.nccl_ring``) without the
command line's imports.
"""

from __future__ import annotations

import os
from pathlib import Path

PLUGIN_NAME = "libnccl-profiler-tf_otel.so"
SOURCES = Path(__file__).resolve().parent / "plugin"
BUILD_SCRIPT = SOURCES / "build.sh"


def cache_path() -> Path:
    """Where the plugin goes when the package's own folder is not writable (site-packages)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tf_otel" / PLUGIN_NAME
