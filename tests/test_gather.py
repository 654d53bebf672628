"""runtime/gather.py: rank 0's rounds are answered once complete, or overdue with the ranks it
has, never twice; open rounds are bounded; the local shortcut on rank 0."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Dict, List, Tuple

from tf_otel.health import counters
from tf_otel.runtime.gather import Gather, to_every_rank, to_reference


def _gather(world: int, wait_s: float = 60.0, max_rounds: int = 4):
    answered: List[Tuple[Any, Dict[int, Any]]] = []
    gather: Gather = Gather(
        lambda: world,
        lambda r, parts: answered.append((r, dict(parts))),
        wait_s,
        max_rounds,
        "t_drop",
    )
    return gather, answered


def test_a_round_is_answered_once_every_rank_is_in():
    gather, answered = _gather(3)
    gather.add(("k", 1), 0, "a")
    gather.add(("k", 1), 2, "c")
    assert answered == []
    gather.add(("k", 1), 1, "b")
    assert answered == [(("k", 1), {0: "a", 1: "b", 2: "c"})]
    gather.add(("k", 2), 0, "x")  # a new round; the answered one is gone
    assert len(answered) == 1 and gather.flush() == [("k", 2)]
    assert answered[-1] == (("k", 2), {0: "x"})


def test_an_overdue_round_is_answered_with_the_ranks_it_has():
    gather, answered = _gather(3, wait_s=0.05)
    gather.add(("k", 1), 0, "a")
    time.sleep(0.1)
    gather.add(("k", 2), 1, "b")  # any later part answers the overdue round
    assert answered == [(("k", 1), {0: "a"})]


def test_open_rounds_are_bounded_and_the_drop_counted():
    gather, answered = _gather(2, max_rounds=4)
    before = counters.get("t_drop", 0)
    for step in range(6):
        gather.add(("k", step), 0, step)
    assert counters.get("t_drop", 0) - before == 2
    assert [r for r, _ in answered] == []
    assert gather.flush() == [("k", s) for s in range(2, 6)]  # the oldest were dropped


def test_rank_0_handles_its_own_part_and_answer_here():
    sent: List[Any] = []
    handled: List[Any] = []
    rank0 = SimpleNamespace(
        topology=SimpleNamespace(is_reference=True, rank=0),
        send_to_reference=sent.append,
        broadcast=lambda m: sent.append(("all", m)) or 3,
    )
    to_reference(rank0, {"t": "x"}, lambda rank, m: handled.append((rank, m)))
    assert handled == [(0, {"t": "x"})] and sent == []
    assert to_every_rank(rank0, {"t": "y"}, handled.append) == 3
    assert sent == [("all", {"t": "y"})] and handled[-1] == {"t": "y"}
    rank1 = SimpleNamespace(topology=SimpleNamespace(is_reference=False, rank=1))
    rank1.send_to_reference = sent.append
    to_reference(rank1, {"t": "z"}, lambda rank, m: handled.append((rank, m)))
    assert sent[-1] == {"t": "z"} and len(handled) == 2
