"""One clock for all ranks, end to end: `horovodrun -np 2` with rank 1's clock shifted by
TF_OTEL_TEST_CLOCK (skew +-2 s, drift 200 ppm). The offsets tf_otel applied to rank 1's spans
must undo the injected error: every step span's remaining error lies within the uncertainty the
span itself claims (min RTT / 2 + fit residual), a claim that is tight against the injected error;
and the exported traces keep every child inside its parent with no collective ending before its
last rank began it."""

from __future__ import annotations

import statistics

import pytest
from conftest import base_env, horovodrun

from tf_otel.analysis.path.causality import CollectiveRecord, find_violations

pytestmark = pytest.mark.integration


# the most a span may claim: half the fastest of 64 back-to-back loopback RTTs plus the fit
# residual came to 15-25 us at load 5-10 on this 2-core machine; a model that ignores the
# drift left errors of 16-52 us in this test, one without the skew would leave 2 s
TIGHT_CLAIM_NS = 100_000


def _percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


@pytest.mark.parametrize("skew_ns", [2_000_000_000, -2_000_000_000, 0])
def test_rank1_offsets_undo_the_injected_clock_error(receiver, skew_ns):
    drift_ppm = 200 if skew_ns else 0
    env = base_env(
        **receiver.env("grpc"),
        TF_OTEL_ENABLED="1",
        STEPS="30",
        TF_OTEL_TEST_CLOCK=f"1:{skew_ns}:{drift_ppm}",
    )
    result = horovodrun("horovod_tape.py", env, backend="gloo")

    def steps(spans, rank):
        return [s for s in spans if s.rank == rank and s.category == "step"]

    # both ranks have exited (their exit flush is done): wait for what they sent, no fixed sleep
    spans = receiver.wait_for(lambda s: min(len(steps(s, 0)), len(steps(s, 1))) >= 30, 10)
    rank1 = steps(spans, 1)
    assert len(rank1) >= 30
    # (error, claimed uncertainty) of each step; step 0 runs while the first sync round completes
    checked = [
        (
            abs(
                s.attributes["tf_otel.clock.offset_ns"]
                + s.attributes["tf_otel.clock.test_error_ns"]
            ),
            s.attributes["tf_otel.clock.uncertainty_ns"],
        )
        for s in rank1
        if s.attributes["tf_otel.step"] >= 1
    ]
    if skew_ns:
        assert abs(rank1[-1].attributes["tf_otel.clock.test_error_ns"]) > 1_000_000_000
    errors = [e for e, _ in checked]
    context = (
        statistics.median(errors),
        _percentile(errors, 0.99),
        checked[:8],
        result.stderr[-3000:],  # the job's own log, should it fail
    )
    # Every span's error lies within the uncertainty its model claims (half the fastest RTT plus
    # the fit residual): the estimator's guarantee. A fixed few us is not: the RTTs a loaded box
    # leaves (30-60 us) allow a few us of asymmetry: this test saw a median of 4.1 us at load 8
    # against the 5 us it had, tests/clock/test_sync_tcp.py 5.8 us under 6 CPU hogs.
    assert all(0 < claim for _, claim in checked), context
    assert all(error <= claim for error, claim in checked), context
    # ... and the claim is tight: an inflated one would hide a model off by the drift or skew
    assert max(claim for _, claim in checked) <= TIGHT_CLAIM_NS, context

    by_id = {s.span_id: s for s in spans}
    for span in spans:
        parent = by_id.get(span.parent_id or "")
        if parent is not None:
            assert parent.start_ns <= span.start_ns <= span.end_ns <= parent.end_ns, span.name
    collectives = [
        CollectiveRecord(s.rank, s.attributes["tf_otel.collective.key"], s.start_ns, s.end_ns)
        for s in spans
        if s.category == "collective" and "tf_otel.collective.key" in s.attributes
    ]
    assert find_violations(collectives) == []
