"""Which steps a job details, known before it runs: the policy picks 1 sampled step in N by the
step's trace id (deterministic: job id, step key, step). With ``STEP_PREPARE`` in its
environment a twin-based (stamps) job prepares its detail twin on the step that traced the
program's function, so every picked step is detailed; by default the twin is prepared in the
background and picked steps before it is ready everywhere are not (tests/horovod/
test_twin_ready.py checks those).

    env.update(STEP_PREPARE)
    job = job_with_detail("tf_function:train_step", range(12), every=2)   # TF_OTEL_JOB_ID
    job = job_without_detail("keras_train", [10, 20], every=20)  # none of these detailed
    expected = detailed_steps(picked)   # picked: steps where detail_wanted(trace id, every)
"""

from typing import Dict, Iterable, Set

from tf_otel.instrument.horovod.collective_source import detail_wanted
from tf_otel.otel.ids import step_trace_id

# the detail twin prepared on the step that traced the program's function: every picked step
# is detailed, whatever the machine's speed (instrument/detail_twin.py)
STEP_PREPARE: Dict[str, str] = {"TF_OTEL_TWIN_PREPARE": "step"}


def detailed_steps(picked: Set[int]) -> Set[int]:
    """The steps a job run with ``STEP_PREPARE`` details: the picked ones."""
    return set(picked)


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
