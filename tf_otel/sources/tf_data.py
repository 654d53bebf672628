"""tf.data pipeline stages of one op-traced TF2 step, from the profiler's XSpace host plane.

Usage (on the export thread, beside ``sources.xplane.host_records``)::

    from tf_otel.sources.tf_data import stage_records
    stages = stage_records(space, step=10, base_ns=base, parent_id=input_record.record_id)

The profiler records every iterator ``GetNext`` as an event named by the iterator's path in the
pipeline, e.g. ``Iterator::Root::Prefetch::MapAndBatch::Map::ForeverRepeat[0]::FlatMap[0]::
TFRecord`` (named by dataset kind, not by the kernels TF picks, so stable across machines). One
Record per stage (path) covers its events in the step: ``input`` under ``parent_id`` (the
step's input span; nested, so the analysis does not count it twice), else ``framework`` under
the step span (the stages run on tf.data's threads beside the step's compute, so as ``input``
spans they would claim its time for input). Attributes:

- ``tensorflow.data.stage`` (``Map``, ``TFRecord`` ...) and ``tensorflow.data.stage.path``;
- ``tf_otel.tf_data.events`` (GetNext calls) and ``tf_otel.tf_data.busy_ns`` (their time);
- ``tf_otel.tf_data.self_ns``: busy time less the GetNext of its input stages nested in it on
  the same thread (XProf's self time);
- asynchronous stages (``Prefetch``, ``ParallelMapV2``, ``MapAndBatch``, parallel ones) wait
  for their own threads: ``tf_otel.tf_data.wait_ns``, ``self_ns`` 0, ``tf_otel.tf_data.async``;
  their functions on tf.data's pool are not attributed (docs/guides/WHOLE_STEP.md).

TF records only events wholly inside the profiling window: a stage running ahead of the step
(behind a prefetch) shows only the GetNext calls within it. At most ``MAX_STAGES`` stages per
step (the busiest). No element values are read.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from tf_otel.record import FRAMEWORK, INPUT, Record
from tf_otel.sources.xplane import HOST_PLANE, time_base_ns

ITERATOR_PREFIX = "Iterator::"
MAX_STAGES = 32
ATTR_STAGE = "tensorflow.data.stage"
ATTR_STAGE_PATH = "tensorflow.data.stage.path"
ATTR_EVENTS = "tf_otel.tf_data.events"
ATTR_BUSY = "tf_otel.tf_data.busy_ns"
ATTR_SELF = "tf_otel.tf_data.self_ns"
ATTR_WAIT = "tf_otel.tf_data.wait_ns"
ATTR_ASYNC = "tf_otel.tf_data.async"
ASYNC_STAGES = frozenset(
    ("Prefetch", "ParallelMap", "ParallelMapV2", "MapAndBatch", "ParallelBatch",
     "ParallelInterleave", "ParallelInterleaveV2", "ParallelInterleaveV3",
     "ParallelInterleaveV4", "LegacyParallelInterleave", "ParallelFilter", "DataService")
)  # fmt: skip
_INDEX = re.compile(r"\[\d+\]$")


def stage_kind(path: str) -> str:
    """``TFRecord`` from ``Iterator::Root::...::FlatMap[0]::TFRecord``."""
    return _INDEX.sub("", path.rsplit("::", 1)[-1])


class _Stage:
    __slots__ = ("path", "start", "end", "events", "busy", "own")

    def __init__(self, path: str, start: int) -> None:
        self.path, self.start, self.end = path, start, start
        self.events, self.busy, self.own = 0, 0, 0


def stage_records(
    space: Any,
    step: Optional[int] = None,
    base_ns: Optional[int] = None,
    parent_id: Optional[int] = None,
    limit: int = MAX_STAGES,
) -> List[Record]:
    """One Record per tf.data stage seen in the host plane (at most ``limit``): ``input`` under
    ``parent_id``, ``framework`` under the step span when ``parent_id`` is None."""
    base: Optional[int] = None
    stages: Dict[str, _Stage] = {}
    for plane in space.planes:
        if plane.name != HOST_PLANE:
            continue
        paths = {
            key: md.name
            for key, md in plane.event_metadata.items()
            if md.name.startswith(ITERATOR_PREFIX)
        }
        if not paths:
            continue
        if base is None:
            base = time_base_ns(space, base_ns)
        for line in plane.lines:
            # events of one thread nest; (end_ps, stage) of the enclosing iterator GetNexts
            open_: List[tuple] = []
            for ev in sorted(
                (e for e in line.events if e.metadata_id in paths), key=lambda e: e.offset_ps
            ):
                start_ps, end_ps = ev.offset_ps, ev.offset_ps + ev.duration_ps
                while open_ and open_[-1][0] <= start_ps:
                    open_.pop()
                path = paths[ev.metadata_id]
                stage = stages.get(path)
                start = base + line.timestamp_ns + start_ps // 1000
                if stage is None:
                    stage = stages[path] = _Stage(path, start)
                stage.start = min(stage.start, start)
                stage.end = max(stage.end, start + ev.duration_ps // 1000)
                stage.events += 1
                stage.busy += ev.duration_ps // 1000
                stage.own += ev.duration_ps // 1000
                if open_ and end_ps <= open_[-1][0]:
                    open_[-1][1].own -= ev.duration_ps // 1000  # the input's time is not its own
                open_.append((end_ps, stage))
    kept = sorted(stages.values(), key=lambda s: s.busy, reverse=True)
    if limit > 0:
        kept = kept[:limit]
    out = []
    category = INPUT if parent_id is not None else FRAMEWORK
    for stage in sorted(kept, key=lambda s: s.start):
        kind = stage_kind(stage.path)
        is_async = kind in ASYNC_STAGES
        own = max(0, stage.own)
        attributes: Dict[str, Any] = {
            ATTR_STAGE: kind,
            ATTR_STAGE_PATH: stage.path,
            ATTR_EVENTS: stage.events,
            ATTR_BUSY: stage.busy,
            ATTR_SELF: 0 if is_async else own,
            ATTR_ASYNC: is_async,
        }
        if is_async:
            attributes[ATTR_WAIT] = own
        out.append(
            Record(
                f"tf.data {kind}",
                stage.start,
                stage.end,
                category,
                step,
                attributes,
                parent_id=parent_id,
            )
        )
    return out
