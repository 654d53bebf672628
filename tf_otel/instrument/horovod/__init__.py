"""Horovod collectives on every rank's step trace, one module per part:

- ``collective_source``: which source (its ``choice``), picked just before ``hvd.init()``:
  ``stamps`` (default) or the timeline (``TF_OTEL_HOROVOD_SOURCE=timeline`` or a program's
  own ``HOROVOD_TIMELINE``);
- ``patching``: hvd.init(), Horovod's TF op functions, hvd.DistributedOptimizer;
- ``stamps``: every rank times its own collectives in its graph (its step hook); in a
  tf.function, on detail steps only, through the function's twin (``instrument.detail_twin``):
  ``stamp_graph`` stamps the twin's graph and reads it back, ``arrival_exchange`` shares each
  detail step's arrivals between the ranks (``hvd.a`` / ``hvd.l``) and emits the records;
- ``graph_stamps``: the same in TF1 graphs, stamps a detail step's ``Session.run`` fetches;
- ``timeline``: rank 0 reads Horovod's timeline (its step hook and the ``hvd.c`` messages).

Both hooks are registered; each works only under its own source. See docs/guides/HOROVOD.md.

Usage::

    from tf_otel.instrument import horovod
    horovod.register()   # idempotent; TF_OTEL_HOROVOD=0 turns collective spans off
"""

from __future__ import annotations

from tf_otel.config import Settings
from tf_otel.health import fail_open
from tf_otel.instrument import detail_twin
from tf_otel.instrument.horovod import patching, stamps, timeline
from tf_otel.instrument.horovod.collective_source import choice

__all__ = ["choice", "register"]

_registered = False


def register(settings: Settings) -> None:
    global _registered
    choice.use(settings)  # before patching: hvd.init() reads it
    detail_twin.prepare_where(settings.twin_prepare, settings.twin_cpu_floor)
    patching.register()
    if _registered:
        return
    _registered = True
    with fail_open("horovod.register"):
        stamps.hook.register(settings.horovod_every, settings.horovod_parts, settings.horovod_fused)
        timeline.hook.register()
