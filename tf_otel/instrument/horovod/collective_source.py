"""Which source gives the Horovod collective spans: picked once, just before ``hvd.init()``.

Usage::

    from tf_otel.instrument.horovod.collective_source import STAMPS, choice
    choice.before_init()          # patching: hvd.init() is about to run
    if choice.current() == STAMPS:
        ...                       # the stamps hook works; the timeline hook stays idle

- ``stamps`` (default): every rank times its own collectives in the graph (``stamps``);
- ``managed``: ``TF_OTEL_HOROVOD_SOURCE=timeline``: tf_otel sets ``HOROVOD_TIMELINE=DYNAMIC``
  and rank 0 starts / stops a timeline file around sampled steps (``timeline``);
- ``user_file``: the program's own ``HOROVOD_TIMELINE`` file is read, never touched;
- ``off``: ``TF_OTEL_HOROVOD=0``, the program's ``HOROVOD_TIMELINE=DYNAMIC``, or Horovod
  initialised before tf_otel with nothing to read.

Without Horovod, a tf.distribute strategy of TensorFlow collective ops (MultiWorkerMirrored-
Strategy) chooses ``stamps`` (instrument/tf_collectives.py sets ``tf_collectives``).

The choice is made at ``hvd.init()``, not at ``register()``: a program may set
``HOROVOD_TIMELINE`` in its own code before it initialises Horovod.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Optional

from tf_otel.config import Settings
from tf_otel.health import log_once
from tf_otel.step_handle import StepHandle

MANAGED, USER_FILE, OFF, STAMPS = "managed", "user_file", "off", "stamps"
TIMELINE_MODES = (MANAGED, USER_FILE)


def detail_wanted(trace_id: int, every: int) -> bool:
    """Collective detail on 1 sampled step in ``every``, picked by the step trace id (the high 64
    bits: independent of the ratio sampler, which reads the low ones); the same on every rank."""
    return every > 0 and (every == 1 or (trace_id >> 64) % every == 0)


class SourceChoice:
    """The process's one choice of source, Horovod's ``HorovodBasics`` once initialised, and the
    detail-step policy both sources follow."""

    def __init__(self) -> None:
        self.settings = Settings()  # those instrument() read, given by use()
        self.mode: Optional[str] = None
        self.basics: Any = None  # horovod.common.basics.HorovodBasics of hvd.init
        self.every = 0  # TF_OTEL_HOROVOD_EVERY: collective detail on 1 sampled step in N
        # the program built a tf.distribute strategy whose all-reduces are TensorFlow
        # collective ops (instrument/tf_collectives.py): the stamps time those, no Horovod
        self.tf_collectives = False
        # devices of this process in each of its collectives (MirroredStrategy's replicas)
        self.replicas = 1

    def use(self, settings: Settings) -> None:
        """The settings register() was given (TF_OTEL_HOROVOD, _SOURCE, _EXACT)."""
        self.settings = settings

    def wanted(self, handle: StepHandle) -> bool:
        """Is this sampled step a collective-detail step (the same steps on every rank)?"""
        return detail_wanted(handle.trace_id, self.every)

    def before_init(self) -> None:
        """Called just before hvd.init(): choose the mode and set Horovod's env."""
        if self.mode is not None:
            return
        if not self.settings.horovod:
            self.mode = OFF
            return
        current = os.environ.get("HOROVOD_TIMELINE", "").strip()
        if not current and self.settings.horovod_source != "timeline":
            self.mode = STAMPS  # no HOROVOD_TIMELINE: its writer thread spins from hvd.init
            return
        if not current:
            os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"
            self.mode = MANAGED
        elif current.upper() == "DYNAMIC":
            self.mode = OFF
            log_once(
                "hvd_user_dynamic",
                "tf_otel: HOROVOD_TIMELINE=DYNAMIC is set by you: tf_otel leaves the timeline "
                "to you and records no Horovod collective spans",
                level=logging.INFO,
            )
        else:
            self.mode = USER_FILE
        if self.settings.horovod_exact:
            os.environ.setdefault("HOROVOD_CACHE_CAPACITY", "0")

    def resolve_late(self) -> None:
        """tf_otel instrumented after hvd.init(): only a user's timeline file can be read."""
        current = os.environ.get("HOROVOD_TIMELINE", "").strip()
        if current and current.upper() != "DYNAMIC" and self.settings.horovod:
            self.mode = USER_FILE
        elif self.settings.horovod and self.settings.horovod_source != "timeline":
            self.mode = STAMPS  # timing our own ops needs nothing set before hvd.init
        else:
            self.mode = OFF
            log_once(
                "hvd_late",
                "tf_otel: Horovod was initialised before tf_otel instrumented it; no collective "
                "spans. Instrument before hvd.init() (or run with TF_OTEL_ENABLED=1)",
            )

    def horovod_ready(self) -> bool:
        basics = self.basics
        if basics is None:
            module = sys.modules.get("horovod.tensorflow.mpi_ops")
            basics = getattr(module, "_basics", None)
            self.basics = basics
        try:
            return basics is not None and bool(basics.is_initialized())
        except Exception:  # noqa: BLE001
            return False

    def current(self) -> Optional[str]:
        """The mode; decided late (``resolve_late``) once Horovod is up if hvd.init() ran
        before tf_otel; without Horovod, ``stamps`` once a tf.distribute strategy of collective
        ops is built (``off`` with TF_OTEL_HOROVOD=0); else None."""
        if self.mode is None and self.horovod_ready():
            self.resolve_late()
        if self.mode is None and self.tf_collectives:
            return STAMPS if self.settings.horovod else OFF
        return self.mode

    def backend(self) -> Optional[str]:
        try:
            return "gloo" if self.basics.gloo_enabled() else "mpi"
        except Exception:  # noqa: BLE001
            return None


choice = SourceChoice()
