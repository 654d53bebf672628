"""Ids every rank derives alike for a step, and the id generator that hands them to the SDK.

A step's trace id and root span id are hashes of (job id, step key, step number), the job id
with the attempt where there is one (``Topology.trace_scope``: a rerun or restart gets traces of
its own): every rank computes the same ones with no message, and rank 0's root span gets
exactly that span id. Each rank's step span id adds the rank, so it is known at step begin (the
step context). An attempt's job span has ids of its own the next attempt can link to.

Usage::

    trace_id = step_trace_id(job_id, "keras_train", 3)
    ids = PrimedIdGenerator(tracer.id_generator); ids.prime(trace_id, root_span_id)
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any, Tuple


def step_trace_id(job_id: str, key: str, step: int) -> int:
    digest = hashlib.sha256(f"{job_id}/{key}/{step}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1


def step_root_span_id(job_id: str, key: str, step: int) -> int:
    digest = hashlib.sha256(f"{job_id}/{key}/{step}/root".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def step_rank_span_id(job_id: str, key: str, step: int, rank: int) -> int:
    """The span id of one rank's step span: known at step begin, so the step can be the current
    context while it runs (instrument/step_context.py) and the exported span has that very id."""
    digest = hashlib.sha256(f"{job_id}/{key}/{step}/rank/{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def job_span_ids(scope: str) -> Tuple[int, int]:
    """The job span's trace id and span id for one attempt (``Topology.trace_scope``): known to
    the next attempt, whose job span links to it."""
    digest = hashlib.sha256(f"{scope}/job".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def fast_root_decision(sampler: Any) -> Any:
    """The SDK's own root decision for the common samplers, without building sampling results
    (same arithmetic as TraceIdRatioBased); None: call the sampler itself."""
    from opentelemetry.sdk.trace import sampling

    if sampler is None:
        return lambda trace_id: True
    root = sampler._root if isinstance(sampler, sampling.ParentBased) else sampler
    if root is sampling.ALWAYS_ON or type(root) is sampling.StaticSampler:
        decision = root._decision.is_sampled()
        return lambda trace_id: decision
    if type(root) is sampling.TraceIdRatioBased:
        bound, mask = root.bound, sampling.TraceIdRatioBased.TRACE_ID_LIMIT
        return lambda trace_id: (trace_id & mask) < bound
    return None


class PrimedIdGenerator:
    """Random ids, except where the pipeline asks for a given next trace / span id."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.local = threading.local()

    def prime(self, trace_id: int, span_id: int) -> None:
        self.local.next = (trace_id, span_id)

    def generate_trace_id(self) -> int:
        primed = getattr(self.local, "next", None)
        return primed[0] if primed else self.inner.generate_trace_id()

    def generate_span_id(self) -> int:
        primed = getattr(self.local, "next", None)
        if primed:
            self.local.next = None
            return primed[1]
        return self.inner.generate_span_id()

    def is_trace_id_random(self) -> bool:
        return False
