"""analysis.step_store: steps pickled to one temporary file and read back one at a time."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path
from typing import Dict, List

import pytest

from tf_otel.analysis.step_store import Paged, PagedSteps


def test_items_come_back_equal_and_new(tmp_path: Path) -> None:
    pages: Paged[Dict[str, List[int]]] = Paged(tmp_path)
    items = [{"step": [n] * n} for n in range(5)]
    assert [pages.append(item) for item in items] == [0, 1, 2, 3, 4]
    assert len(pages) == 5
    assert list(pages) == items
    assert pages[-1] == items[4]
    assert pages[2] is not pages[2]  # each read is a new copy: a change is not kept
    assert os.listdir(tmp_path) == []  # the file is unlinked from the start
    pages.close()


def test_a_stored_change_replaces_the_item(tmp_path: Path) -> None:
    pages: Paged[List[int]] = Paged(tmp_path)
    for n in range(3):
        pages.append([n])
    pages[1] = [10, 11, 12]
    pages[-1] = [20]
    assert list(pages) == [[0], [10, 11, 12], [20]]


def test_slices_and_views_read_when_asked(tmp_path: Path) -> None:
    pages: Paged[int] = Paged(tmp_path)
    for n in range(10):
        pages.append(n)
    view = pages[2:8:2]
    assert len(view) == 3 and list(view) == [2, 4, 6]
    assert view[1] == 4 and list(view[1:]) == [4, 6]


@pytest.mark.parametrize("index", [3, -4])
def test_an_index_out_of_range_names_itself(tmp_path: Path, index: int) -> None:
    pages: Paged[int] = Paged(tmp_path)
    for n in range(3):
        pages.append(n)
    with pytest.raises(IndexError, match=f"step {index} of 3"):
        pages[index]


class _Step:
    """A stand-in with what PagedSteps reads (``warmup``)."""

    def __init__(self, key: int, warmup: bool) -> None:
        self.key, self.warmup = key, warmup

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Step) and (self.key, self.warmup) == (other.key, other.warmup)


def test_warm_up_marks_filter_without_reading_every_step(tmp_path: Path) -> None:
    steps = PagedSteps(tmp_path)
    for key in range(6):
        steps.append(_Step(key, key < 2))  # type: ignore[arg-type]
    assert [s.key for s in steps.where(warmup=True)] == [0, 1]
    assert [s.key for s in steps.where(warmup=False)] == [2, 3, 4, 5]
    steps[3] = _Step(3, True)  # type: ignore[assignment]
    assert [s.key for s in steps.where(warmup=False)] == [2, 4, 5]


def test_memory_holds_two_numbers_an_item(tmp_path: Path) -> None:
    # a 10 KB item each: 1,000 of them stay on disk, not in memory
    pages: Paged[bytes] = Paged(tmp_path)
    tracemalloc.start()
    try:
        for n in range(1000):
            pages.append(bytes([n % 256]) * 10_000)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 100_000, held  # against 10 MB of items
    assert pages[999] == bytes([999 % 256]) * 10_000
