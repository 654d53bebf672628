"""Two hosts, one clock each: a simulated cluster (hostA, hostB as network namespaces, horovodrun
over ssh from a separate login host), host B's clock 1.5 s ahead, no TF_OTEL_COORDINATOR. Rank 0's
address must come from the launch itself (Horovod's rendezvous store), over the bridge: one trace
per step holding all 4 ranks under one root, every child inside its parent, and the offsets
applied to host B's ranks undoing the injected skew (median within 20 us). Run with host relays
off and on."""

from __future__ import annotations

import statistics
from collections import defaultdict

import pytest
from otlp_receiver import OtlpReceiver
from sim import Cluster

pytestmark = pytest.mark.integration
SKEW_NS = 1_500_000_000
STEPS = 12


@pytest.fixture
def cluster():
    with Cluster(hosts=2, slots=2, skew_ns={"hostB": SKEW_NS}) as c:
        yield c


# host relays (cluster/host_relay.py) off and on (the default): the ranks' environment is
# built here (base_env drops the caller's TF_OTEL_*), so the test names both
@pytest.mark.parametrize("relay", ["0", "1"], ids=["direct", "host_relay"])
def test_two_hosts_skewed_clock_one_trace_per_step(cluster, relay):
    with OtlpReceiver(host=cluster.gateway) as receiver:
        env = cluster.env(
            **receiver.env("grpc"), TF_OTEL_ENABLED="1", STEPS=str(STEPS), TF_OTEL_HOST_RELAY=relay
        )
        assert "TF_OTEL_COORDINATOR" not in env
        result = cluster.horovodrun("horovod_tape.py", env)
        spans = receiver.wait_for(lambda s: False, 3)
    log = result.stderr[-3000:]

    steps = [s for s in spans if s.category == "step"]
    hosts = {s.rank: s.resource.get("host.name") for s in steps}
    assert hosts == {0: "hostA", 1: "hostA", 2: "hostB", 3: "hostB"}, (hosts, log)
    roots = [s for s in spans if s.category == "step.root"]
    by_trace = defaultdict(list)
    for span in steps:
        by_trace[span.trace_id].append(span)
    assert len(by_trace) >= STEPS, log
    roots_by_trace = defaultdict(list)
    for root in roots:
        roots_by_trace[root.trace_id].append(root)
    for trace_id, members in by_trace.items():
        assert sorted(s.rank for s in members) == [0, 1, 2, 3], (trace_id, log)
        assert len(roots_by_trace[trace_id]) == 1, (trace_id, log)

    by_id = {s.span_id: s for s in spans}
    outside = [
        s.name
        for s in spans
        if (p := by_id.get(s.parent_id or ""))
        and not p.start_ns <= s.start_ns <= s.end_ns <= p.end_ns
    ]
    assert outside == [], (outside[:5], log)

    skewed = [s for s in steps if s.rank in (2, 3) and s.attributes.get("tf_otel.step", 0) >= 1]
    truth = [s.attributes["tf_otel.clock.test_error_ns"] for s in skewed]
    assert min(truth) >= SKEW_NS - 1_000_000, truth[:4]  # the fault really was injected
    errors = [
        abs(s.attributes["tf_otel.clock.offset_ns"] + s.attributes["tf_otel.clock.test_error_ns"])
        for s in skewed
    ]
    assert statistics.median(errors) <= 20_000, (sorted(errors)[:8], log)
