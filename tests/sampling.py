"""Which steps a ratio sampler keeps, worked out from the trace ids the steps get (one trace a
step: ``step_trace_id(job, key, step)``) with the OpenTelemetry SDK's own sampler, so a test of
sampling asserts the exact set instead of a range that chance leaves now and then.

Usage::

    train = [s for s in spans if s.category == "step" and "train_step" in s.name]
    expected = ratio_sampled_steps(spans, train, range(10), 0.5)  # the steps the SDK samples
    assert {s.attributes["tf_otel.step"] for s in train} == expected
"""

from __future__ import annotations

import re
from typing import Any, Iterable, List, Set

from tf_otel.otel.ids import step_trace_id

_ROOT_NAME = re.compile(r"^(.*) step (\d+)$")


def ratio_sampled_steps(
    spans: List[Any], kind: List[Any], steps: Iterable[int], ratio: float
) -> Set[int]:
    """The numbers in ``steps`` whose step trace ``ParentBased(TraceIdRatioBased(ratio))``
    samples, for the job and step key of the roots of the traces of ``kind`` (step spans of one
    step function among the received ``spans``: at least one must have been sampled; a root's
    trace id must be the one its key gives)."""
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    traces = {s.trace_id for s in kind}
    roots = [s for s in spans if s.category == "step.root" and s.trace_id in traces]
    assert roots, "no step root was sampled: the job and key cannot be read"
    keys = set()
    for root in roots:
        found = _ROOT_NAME.match(root.name)
        assert found, root.name
        job = root.resource.get("tf_otel.job.id") or root.attributes.get("tf_otel.job.id")
        key, number = found.group(1), int(found.group(2))
        assert step_trace_id(job, key, number) == int(root.trace_id, 16), root.name
        keys.add((job, key))
    assert len(keys) == 1, keys
    job, key = keys.pop()
    sampler = ParentBased(TraceIdRatioBased(ratio))
    return {
        step
        for step in steps
        if sampler.should_sample(None, step_trace_id(job, key, step), "step").decision.is_sampled()
    }
