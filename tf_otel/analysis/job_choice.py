"""Which job, and which attempt of it, the input's traces are analysed as: the one given
(``--job``), else the only one; a job's other attempts in the input are said, not mixed in.

Usage::

    job = chosen_job(traces, job_id)       # AnalysisError naming the jobs when it is ambiguous
    notes = attempt_notes(traces, job)     # the report's line on the attempts left out
"""

from __future__ import annotations

from typing import List, Optional

from tf_otel.analysis.errors import AnalysisError
from tf_otel.analysis.model import ATTEMPT_MARK, base_job
from tf_otel.analysis.trace_source import TraceSource


def chosen_job(traces: TraceSource, job_id: Optional[str]) -> Optional[str]:
    """``job_id``, checked; without it the input must hold at most one job. A job's attempts
    (``model.job_of``: "<job id>@<attempt>") are jobs of their own: ``job_id`` without an
    attempt chooses the job's only one."""
    jobs = traces.job_ids()
    if job_id is None:
        if len(jobs) > 1:
            listed = ", ".join(sorted(jobs)[:10])
            bases = {base_job(job) for job in jobs}
            if len(bases) == 1:
                raise AnalysisError(
                    f"the traces hold {len(jobs)} attempts of job {bases.pop()} ({listed}: a "
                    "rerun or restart, each its own traces): choose one with --job"
                )
            raise AnalysisError(
                f"the traces hold {len(jobs)} jobs ({listed}): choose one with --job"
            )
        return None
    if job_id not in jobs:
        attempts = sorted(job for job in jobs if base_job(job) == job_id)
        if len(attempts) == 1:
            return attempts[0]
        if attempts:
            raise AnalysisError(
                f"job {job_id!r} has {len(attempts)} attempts in the input "
                f"({', '.join(attempts[:10])}): choose one with --job"
            )
        raise AnalysisError(f"no spans of job {job_id!r} in the input")
    return job_id


def attempt_notes(traces: TraceSource, job_id: Optional[str]) -> List[str]:
    """What the report says of the job's other attempts in the input, left out."""
    if job_id is None or ATTEMPT_MARK not in job_id:
        return []
    base = base_job(job_id)
    others = sorted(job for job in traces.job_ids() if job != job_id and base_job(job) == base)
    if not others:
        return []
    return [
        f"job {base}: attempt {job_id[len(base) + 1 :]} analysed; the input also holds "
        f"{', '.join(others[:10])} (a rerun or restart: each attempt is analysed alone, "
        "--job chooses)"
    ]
