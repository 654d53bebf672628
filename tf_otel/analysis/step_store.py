"""Steps kept on disk while the analysis runs: each pickled into one unlinked temporary file and
read back when asked for, so memory holds the steps in use, not every step of the job.

Usage::

    pages = Paged(directory)          # directory: where the file goes (None: TMPDIR)
    index = pages.append(outline)     # its position
    outline = pages[index]            # a new copy, read back from the file
    pages[index] = changed            # written again (the old bytes stay behind, unread)
    steps = PagedSteps(directory)     # a Paged of StepResults that keeps their warm-up marks
    steps.where(warmup=False)         # a view of the steady steps, read one at a time

Every read makes new objects: a change to one is lost unless it is stored again. Used where the
traces are read from a source that builds them anew (``TraceSource.fresh``); with the spans in
memory a plain list holds the steps.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from array import array
from dataclasses import replace
from typing import (
    IO,
    Dict,
    FrozenSet,
    Generic,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
    overload,
)

from tf_otel.analysis.result import StepDigest, StepMarks, StepResult, step_digest, what_if_ns

T = TypeVar("T")


class Paged(Sequence[T], Generic[T]):
    """A list of picklable objects on disk (one file, an offset and length each in memory)."""

    def __init__(self, directory: Optional[Union[str, os.PathLike[str]]] = None) -> None:
        self._file: IO[bytes] = tempfile.TemporaryFile(prefix="tf-otel-steps-", dir=directory)
        self._where = array("q")  # offset, length: two a piece
        self._end = 0

    def _write(self, item: T) -> int:
        data = pickle.dumps(item, pickle.HIGHEST_PROTOCOL)
        offset = self._end
        self._file.seek(offset)
        self._file.write(data)
        self._end = offset + len(data)
        return offset

    def append(self, item: T) -> int:
        offset = self._write(item)
        self._where.extend((offset, self._end - offset))
        return len(self) - 1

    def __setitem__(self, index: int, item: T) -> None:
        index = self._at(index)
        offset = self._write(item)
        self._where[2 * index], self._where[2 * index + 1] = offset, self._end - offset

    def __len__(self) -> int:
        return len(self._where) // 2

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[T, Sequence[T]]:
        if isinstance(index, slice):
            return View(self, range(len(self))[index])
        index = self._at(index)
        offset, length = self._where[2 * index], self._where[2 * index + 1]
        self._file.seek(offset)
        return self._loaded(index, pickle.loads(self._file.read(length)))

    def _loaded(self, index: int, item: T) -> T:
        """An item as read back (a subclass may add to it)."""
        return item

    def __iter__(self) -> Iterator[T]:
        for index in range(len(self)):
            yield self[index]

    def _at(self, index: int) -> int:
        count = len(self)
        if not -count <= index < count:
            raise IndexError(f"step {index} of {count}")
        return index % count

    def close(self) -> None:
        self._file.close()


class View(Sequence[T], Generic[T]):
    """Some of a ``Paged``'s items, by position, read when asked for."""

    def __init__(self, pages: Paged[T], indices: Sequence[int]) -> None:
        self._pages, self._indices = pages, indices

    def __len__(self) -> int:
        return len(self._indices)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[T, Sequence[T]]:
        if isinstance(index, slice):
            return View(self._pages, self._indices[index])
        return self._pages[self._indices[index]]

    def __iter__(self) -> Iterator[T]:
        for index in self._indices:
            yield self._pages[index]


class PagedSteps(Paged[StepResult]):
    """Analysed steps on disk, with each one's digest in memory (``result.StepDigest``: its
    warm-up mark, duration, path sums, ranks and lateness), which the reports filter on and sum
    again and again; the marks the statistics over all steps give them (``mark``) are kept in
    memory too and put on each step as it is read, not written with it."""

    def __init__(self, directory: Optional[Union[str, os.PathLike[str]]] = None) -> None:
        super().__init__(directory)
        self._digests: List[StepDigest] = []
        self._ranks: Dict[Tuple[int, ...], Tuple[int, ...]] = {}  # one tuple for equal ranks
        self._libraries: Dict[FrozenSet[str], FrozenSet[str]] = {}  # one set for equal ones
        self._marks: Dict[int, StepMarks] = {}

    def _digest(self, item: StepResult) -> StepDigest:
        digest = step_digest(item)
        ranks = self._ranks.setdefault(digest.ranks, digest.ranks)
        late = self._ranks.setdefault(digest.lateness_ranks, digest.lateness_ranks)
        libraries = self._libraries.setdefault(digest.libraries, digest.libraries)
        return replace(digest, ranks=ranks, lateness_ranks=late, libraries=libraries)

    def append(self, item: StepResult) -> int:
        self._digests.append(self._digest(item))
        return super().append(item)

    def __setitem__(self, index: int, item: StepResult) -> None:
        super().__setitem__(index, item)
        self._marks.pop(self._at(index), None)  # the step as stored, marks and all
        self._digests[self._at(index)] = self._digest(item)

    def mark(self, index: int, marks: StepMarks) -> None:
        """Mark a step without writing it again (its digest follows the marks)."""
        index = self._at(index)
        self._marks[index] = marks
        digest = self._digests[index]
        self._digests[index] = replace(
            digest,
            warmup=marks.warmup,
            what_if_ns=what_if_ns(digest.duration_ns, marks.straggler),
        )

    def select(self, order: Sequence[int]) -> None:
        """Keep the steps stored at ``order``'s positions, in that order (steps analysed out
        of order, some not selected after all): step ``n`` is then the one stored ``order[n]``-th
        and reads back with its key ``n``; nothing is read or written."""
        if self._marks:
            raise ValueError("steps marked before they were put in order")
        where = array("q")
        for at in order:
            where.extend((self._where[2 * at], self._where[2 * at + 1]))
        self._where = where
        self._digests = [self._digests[at] for at in order]

    def _loaded(self, index: int, item: StepResult) -> StepResult:
        item.key = index  # its position (``select``)
        marks = self._marks.get(index)
        if marks is not None:
            marks.put_on(item)
        return item

    def digest(self, index: int) -> StepDigest:
        """One step's digest."""
        return self._digests[self._at(index)]

    def digests(self) -> List[StepDigest]:
        """Every step's digest, in order."""
        return list(self._digests)

    def where(self, warmup: bool) -> View[StepResult]:
        """The steps whose warm-up mark is ``warmup``, in order."""
        return View(self, [i for i, d in enumerate(self._digests) if d.warmup == warmup])
