"""How a rank spent a window of its step (``stragglers.window_split``), against counting each
nanosecond of random timelines: ops one after another (the usual case) and overlapping spans
(communication over input over compute), with and without op spans."""

from __future__ import annotations

import random
from typing import Dict, List

from tf_otel.analysis.model import Span
from tf_otel.analysis.path.critical_path import (
    PATH_BEFORE_STEP,
    PATH_COMMUNICATION,
    PATH_COMPUTE,
    PATH_FRAMEWORK,
    PATH_INPUT,
)
from tf_otel.analysis.steps import RankTimeline
from tf_otel.analysis.stragglers import EXCESS_CATEGORIES, window_split

_KINDS = {"collective": PATH_COMMUNICATION, "input": PATH_INPUT, "compute": PATH_COMPUTE}
_FIRST = (PATH_COMMUNICATION, PATH_INPUT, PATH_COMPUTE)  # who names time where spans overlap


def _timeline(rng: random.Random, overlapping: bool, ops: bool) -> RankTimeline:
    timeline = RankTimeline(0, 10, 90, None)
    nodes: List[Span] = []
    t = 10
    kinds = list(_KINDS) if ops else ["collective", "input"]
    for i in range(rng.randint(0, 12)):
        start = t - rng.randint(0, 6) if overlapping else t + rng.randint(0, 4)
        end = start + rng.randint(0, 9)
        category = rng.choice(kinds)
        attributes = {"tf_otel.category": category, "tf_otel.rank": 0}
        nodes.append(Span("t", f"{i:016x}", None, category, start, end, attributes, {}))
        t = max(t, end)
    timeline.fill(nodes, [], {})
    return timeline


def _counted(timeline: RankTimeline, begin: int, end: int) -> Dict[str, int]:
    split = dict.fromkeys(EXCESS_CATEGORIES, 0)
    ops = any(s.category == "compute" for s in timeline.nodes)
    for t in range(begin, end):
        if t < timeline.start_ns:
            split[PATH_BEFORE_STEP] += 1
            continue
        open_kinds = {_KINDS[s.category] for s in timeline.nodes if s.start_ns <= t < s.end_ns}
        named = next((k for k in _FIRST if k in open_kinds), None)
        split[named or (PATH_FRAMEWORK if ops else PATH_COMPUTE)] += 1
    return split


def test_window_splits_match_counting_each_nanosecond():
    rng = random.Random(11)
    for case in range(3000):
        timeline = _timeline(rng, overlapping=case % 2 == 1, ops=case % 3 != 0)
        begin = rng.randint(0, 60)
        end = begin + rng.randint(0, 50)
        assert window_split(timeline, begin, end) == _counted(timeline, begin, end), case
