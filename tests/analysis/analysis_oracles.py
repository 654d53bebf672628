"""The plain analysis the fast one is compared with, made on the test side.

The product picks its fast paths from what it is given: steps from skeletons where the source
keeps them, each step analysed as it is built where one process reads spilled traces. These
give it the inputs that take the plain path, so tests compare the two on the same traces.

Usage::

    with load_spilled([directory], workers=1) as source:
        plain = analyze_source(WholeSteps(source))        # every step built from all its spans
        two = analyze_source(source, engine=TwoPasses())  # every step analysed in a second pass
"""

from __future__ import annotations

from typing import Any, List, Set

from tf_otel.analysis.engine import InProcess
from tf_otel.analysis.model import Span


class WholeSteps:
    """A spilled source without its skeletons (as spans held in memory are): every step is
    built from all its spans."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self.fresh: bool = source.fresh
        self.directory = getattr(source, "directory", None)  # where the steps wait on disk
        self.load_warnings: List[str] = getattr(source, "load_warnings", [])

    def trace_ids(self) -> List[str]:
        return self._source.trace_ids()

    def spans(self, trace_id: str) -> List[Span]:
        return self._source.spans(trace_id)

    def job_ids(self) -> Set[str]:
        return self._source.job_ids()

    def view(self, trace_ids: List[str]) -> WholeSteps:
        return WholeSteps(self._source.view(trace_ids))


class TwoPasses(InProcess):
    """This process, planned as for several workers: no step is analysed as it is built, every
    one in the second pass."""

    workers = 2
