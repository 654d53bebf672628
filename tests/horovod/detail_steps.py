"""The steps a twin-based (stamps) job details: the ones the policy picks by trace id, and the
step after the one that traced the program's function when that step was not itself a detail
step (the twin, traced beside it, runs then: instrument/twin.py ``warm_pending``).

    expected = detailed_steps(picked)   # picked: steps where detail_wanted(trace id, every)
"""

from typing import Set


def detailed_steps(picked: Set[int], traced: int = 0) -> Set[int]:
    """``traced``: the step whose call traced the step function (the first: 0)."""
    return set(picked) | (set() if traced in picked else {traced + 1})
