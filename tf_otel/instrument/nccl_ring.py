"""NCCL collectives from tf_otel's NCCL profiler plugin, as kernel spans under their step.

Usage::

    TF_OTEL_ENABLED=1 TF_OTEL_NCCL_PROFILER=1 horovodrun -np 8 python train.py

``TF_OTEL_NCCL_PROFILER=1`` points ``NCCL_PROFILER_PLUGIN`` at the built plugin (``tf-otel
nccl-plugin``; ``scripts/build_nccl_plugin.sh`` in a clone) unless the variable is already set;
NCCL then loads it when its first communicator is created, and the plugin writes every
collective into this process's
ring (``/dev/shm/tf_otel_nccl_<pid>``, unlinked once both sides have mapped it). For each
sampled step the export thread reads the ring and emits the collectives that began inside the
step as ``nccl.<Coll>`` kernel spans under the step span, with ``nccl.comm_hash`` +
``nccl.collective`` + ``nccl.seq`` (the same on every rank for one collective; NCCL numbers
collectives per type). Collectives of unsampled steps are
read and dropped. Nothing runs on the training thread but one list append per sampled step.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, List, MutableMapping, Optional

from tf_otel.config import Settings
from tf_otel.health import count, fail_open, log_once
from tf_otel.instrument._patching import HookOrder, StepCall, StepHook, add_step_hook
from tf_otel.nccl.plugin_files import PLUGIN_NAME, SOURCES, cache_path
from tf_otel.record import Record
from tf_otel.runtime.lifecycle import get_pipeline
from tf_otel.step_handle import StepHandle

log = logging.getLogger(__name__)

PLUGIN_ENV = "NCCL_PROFILER_PLUGIN"
ENABLE_ENV = "TF_OTEL_NCCL_PROFILER"
PLUGIN_PATH = SOURCES / PLUGIN_NAME  # built from a clone or by `tf-otel nccl-plugin`


def plugin_paths() -> List[Path]:
    """Where a built plugin is looked for: beside its sources, then the user's cache (where
    ``tf-otel nccl-plugin`` writes it when the package's folder is read-only)."""
    return [PLUGIN_PATH, cache_path()]


SETTLE_NS = 50_000_000  # a collective's record may be rewritten until its last child event ends
_RETRY_OPEN_NS = 1_000_000_000
_MAX_BUFFERED = 65536


class RingSteps:
    """Reads this process's ring on the export thread and hands each step its collectives."""

    def __init__(self) -> None:
        self.directory: Optional[str] = None  # TF_OTEL_NCCL_RING_DIR, given by register()
        self._reader: Any = None
        self._next_open_ns = 0
        self._buffer: List[Record] = []  # read, not yet given to a step: newest steps' ones
        self._lock = threading.Lock()  # deferred work runs on the export thread; shutdown too

    def records_for(self, start_ns: int, end_ns: int, rank: int, step: int) -> List[Record]:
        with self._lock:
            reader = self._open()
            if reader is None:
                return []
            wait_ns = end_ns + SETTLE_NS - time.time_ns()
            if wait_ns > 0:  # let the step's last collectives settle (export thread only)
                time.sleep(min(wait_ns, SETTLE_NS) / 1e9)
            self._buffer.extend(reader.poll(rank=rank, settle_ns=SETTLE_NS))
            self._buffer.sort(key=lambda r: r.start_ns)
            mine = [r for r in self._buffer if start_ns <= r.start_ns <= end_ns]
            # older ones belong to unsampled steps; newer ones wait for their step
            self._buffer = [r for r in self._buffer if r.start_ns > end_ns][-_MAX_BUFFERED:]
            for record in mine:
                record.step = step
            count("nccl_collectives", len(mine))
            return mine

    def _open(self) -> Any:
        if self._reader is not None:
            return self._reader
        now = time.time_ns()
        if now < self._next_open_ns:
            return None
        self._next_open_ns = now + _RETRY_OPEN_NS
        from tf_otel.nccl.ring import RingError, RingReader, ring_path

        path = ring_path(directory=self.directory)
        if not os.path.exists(path):
            return None  # NCCL has not loaded the plugin (yet): no communicator so far
        try:
            self._reader = RingReader.open(path)
        except RingError as error:
            log_once("nccl_ring_open", "tf_otel: cannot read the NCCL profiler ring: %s", error)
            self._next_open_ns = now + 60 * _RETRY_OPEN_NS
            return None
        try:  # both sides keep their mapping: no file is left behind, even after a crash
            os.unlink(path)
        except OSError:
            pass
        log.debug("tf_otel: reading NCCL collectives from %s", path)
        return self._reader


class NcclRingHook(StepHook[None]):
    order = HookOrder.NCCL

    def __init__(self) -> None:
        self.active = False
        self.ring = RingSteps()

    def on_step_start(self, handle: StepHandle, call: StepCall) -> None:
        if self.active and handle.sampled:
            handle.deferred.append(lambda: self._records(handle))

    def _records(self, handle: StepHandle) -> List[Record]:
        rank = get_pipeline().topology.rank
        return self.ring.records_for(handle.start_ns, handle.end_ns, rank, handle.step)


hook = NcclRingHook()


def plugin_requested(
    env: Optional[MutableMapping[str, str]] = None, settings: Optional[Settings] = None
) -> bool:
    """Point NCCL at the plugin when asked (``settings``, else those an explicit ``env`` gives);
    whether NCCL will load a profiler plugin at all."""
    target = os.environ if env is None else env
    if settings is None:
        settings = Settings.from_env(target)
    if settings.nccl_profiler and not target.get(PLUGIN_ENV):
        built = next((path for path in plugin_paths() if path.exists()), None)
        if built is not None:
            target[PLUGIN_ENV] = str(built)
        else:
            log_once(
                "nccl_plugin_missing",
                "tf_otel: %s=1 but the NCCL profiler plugin is not built (looked for %s); run "
                "tf-otel nccl-plugin",
                ENABLE_ENV,
                " and ".join(map(str, plugin_paths())),
            )
    return bool(target.get(PLUGIN_ENV))


def register(settings: Settings) -> None:
    hook.active = plugin_requested(settings=settings)
    hook.ring.directory = settings.nccl_ring_dir
    if not hook.active:
        return
    add_step_hook(hook)
    with fail_open("nccl_ring.stale"):
        from tf_otel.nccl.ring import cleanup_stale

        cleanup_stale(settings.nccl_ring_dir)
