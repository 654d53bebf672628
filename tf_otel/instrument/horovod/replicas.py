"""Several devices of one process in one collective (MirroredStrategy, or MultiWorkerMirrored-
Strategy with several GPUs a worker): which stamped ops are replicas of one collective.

Usage::

    names = ReplicaNames()
    name, replica = names.name_for(graph, op.device, op.name)   # while the graph is built

tf.distribute calls its per-device launchers device by device, in the same order, so the k-th
collective each device builds in a graph is one collective of its replicas. They share the
name of the first device's op (so every worker names it alike); the replica is the device's
place in the order the devices first built one. At step time
``sources.horovod_stamp_records.merge_replicas`` makes them the process's one collective.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple


class ReplicaNames:
    """The k-th collective of each device in one graph: one collective of its replicas."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._graphs: weakref.WeakKeyDictionary[Any, _ReplicaOrder] = weakref.WeakKeyDictionary()

    def name_for(self, graph: Any, device: str, name: str) -> Tuple[str, int]:
        with self._lock:
            order = self._graphs.get(graph)
            if order is None:
                order = self._graphs[graph] = _ReplicaOrder()
            replica = order.devices.setdefault(device, len(order.devices))
            k = order.built.get(device, 0)
            order.built[device] = k + 1
            if k == len(order.names):
                order.names.append(name)
            return order.names[k], replica


@dataclass
class _ReplicaOrder:
    devices: Dict[str, int] = field(default_factory=dict)  # device -> replica (first seen)
    built: Dict[str, int] = field(default_factory=dict)  # device -> collectives built
    names: List[str] = field(default_factory=list)  # the k-th collective's name
