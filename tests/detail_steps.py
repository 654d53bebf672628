"""Which steps a job details, known before it runs: the policy picks 1 sampled step in N by the
step's trace id (deterministic: job id, step key, step), and a twin-based (stamps) job also
details the step after the one that traced the program's function, when that step was not
itself picked (the twin, traced beside it, runs then: instrument/twin.py ``warm_pending``).

    job = job_with_detail("tf_function:train_step", range(12), every=2)   # TF_OTEL_JOB_ID
    job = job_without_detail("keras_train", [10, 20], every=20)  # none of these detailed
    expected = detailed_steps(picked)   # picked: steps where detail_wanted(trace id, every)
"""

from typing import Iterable, Set

from tf_otel.instrument.horovod.choice import detail_wanted
from tf_otel.pipeline.ids import step_trace_id


def detailed_steps(picked: Set[int], traced: int = 0) -> Set[int]:
    """``traced``: the step whose call traced the step function (the first: 0)."""
    return set(picked) | (set() if traced in picked else {traced + 1})


def _job(key: str, steps: Iterable[int], every: int, prefix: str, wanted: range) -> str:
    steps = list(steps)
    for i in range(1000):
        job = f"{prefix}-{i}"
        picked = sum(detail_wanted(step_trace_id(job, key, n), every) for n in steps)
        if picked in wanted:
            return job
    raise AssertionError("no job id found")


def job_with_detail(key: str, steps: Iterable[int], every: int, prefix: str = "job") -> str:
    """A job id whose policy details some but not all of ``steps`` (of step key ``key``)."""
    steps = list(steps)
    return _job(key, steps, every, prefix, range(1, len(steps)))


def job_without_detail(key: str, steps: Iterable[int], every: int, prefix: str = "job") -> str:
    """A job id whose policy details none of ``steps`` (of step key ``key``)."""
    return _job(key, steps, every, prefix, range(0, 1))
