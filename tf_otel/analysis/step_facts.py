"""What the cross-step rules read from one step's spans, taken before its spans are dropped.

Usage::

    facts = step_facts(trace)        # while the trace still holds its spans (not slimmed)
    facts.libraries                  # {"horovod"}: whose collectives the step ran
    facts.replica_worst[rank]        # (spread ns, last replica, replicas): its widest spread
    facts.gpu_samples                # ((rank, value), ...): the older per-span GPU attribute

The analysis keeps these few values per step instead of the step's spans, so a whole job's
statistics fit in memory however many spans it has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Optional, Tuple

from tf_otel import record
from tf_otel.analysis.steps import StepTrace
from tf_otel.record import COLLECTIVE

_LIBRARIES = frozenset(("horovod", "tensorflow"))


@dataclass(frozen=True)
class StepFacts:
    libraries: FrozenSet[str] = frozenset()
    replica_worst: Dict[int, Tuple[int, int, int]] = field(default_factory=dict)
    gpu_samples: Tuple[Tuple[Optional[int], Any], ...] = ()


def step_facts(trace: StepTrace) -> StepFacts:
    names = set()  # every rank names the same collectives: each name's library taken once
    worst: Dict[int, Tuple[int, int, int]] = {}  # rank -> (spread, replica, replicas)
    for span in trace.spans:
        if span.category != COLLECTIVE:
            continue
        names.add(span.name)
        attributes = span.attributes
        if span.rank is None or record.ATTR_REPLICA_SPREAD_NS not in attributes:
            continue
        try:
            spread = int(attributes[record.ATTR_REPLICA_SPREAD_NS])
            last = int(attributes[record.ATTR_REPLICA_LAST])
            replicas = int(attributes[record.ATTR_REPLICAS])
        except (KeyError, TypeError, ValueError):
            continue
        if span.rank not in worst or spread > worst[span.rank][0]:
            worst[span.rank] = (spread, last, replicas)
    # "horovod.<op> ..." / "tensorflow.<op> ..."
    libraries = {name.split(".", 1)[0] for name in names}
    gpu = tuple((s.rank, s.gpu_utilization) for s in trace.spans if s.gpu_utilization is not None)
    return StepFacts(frozenset(libraries & _LIBRARIES), worst, gpu)
