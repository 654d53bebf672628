"""What a host relay costs, and what it saves rank 0, per step extent (cluster/host_relay.py).

One process: rank 0's ``StepAggregator`` and the 8 ranks of one host, each with the product's
link (``coordinator_link``: with relays, one of them leads and relays the others), over real
TCP on loopback with the handshake. The ranks report STEPS steps as fast as the links take
them; CPU is read per thread from /proc: rank 0's coordinator loop, the relay's loop, the
ranks' sending threads.

Usage::

    python bench/bench_host_relay.py             # relay, then the control (direct)
    python bench/bench_host_relay.py --steps 3000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List

import harness  # bench/ is on sys.path: run as a script, or put there by the caller

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RANKS = 9  # rank 0 and one host of 8
SECRET = "bench-host-relay-secret-0123456789"


def measure(relay: bool, steps: int) -> Dict[str, Any]:
    from tf_otel.cluster.coordinator import StepAggregator
    from tf_otel.cluster.relay_route import close_link, coordinator_link
    from tf_otel.config import Settings
    from tf_otel.job import job_secret
    from tf_otel.job.topology import Topology

    key = job_secret.job_key({"TF_OTEL_JOB_SECRET": SECRET})
    whole: List[int] = []
    aggregator = StepAggregator(
        RANKS, 3.0, lambda *root: whole.append(root[4]), secret=key, first_report_grace_s=0.0
    )
    assert aggregator.serve(("127.0.0.1", 0)) and aggregator.address is not None
    job_id = f"bench-relay-{uuid.uuid4().hex[:8]}"
    settings = Settings(host_relay=relay)
    clients = [
        coordinator_link(
            settings,
            Topology(rank=r, world_size=RANKS, local_size=8, host="h1", job_id=job_id),
            aggregator.address,
            None,
            key,
            rank0_host_direct=False,  # rank 0 is on this machine too: relay all the same
        )
        for r in range(1, RANKS)
    ]
    while len(aggregator.connected_ranks()) < RANKS - 1:
        time.sleep(0.05)
    connections = aggregator.connection_count()
    before, began = harness.thread_cpu(), time.monotonic()
    for step in range(steps):
        for client in clients:
            client.report("k", step, 10**18 + step, 10**18 + step + 5)
        aggregator.add(0, "k", step, 10**18 + step, 10**18 + step + 5)
        time.sleep(0.002)  # the links keep up: no queue grows
    while len(whole) < steps and time.monotonic() - began < 120:
        time.sleep(0.05)
    after = harness.thread_cpu()
    for client in clients:
        close_link(client, 1.0)
    aggregator.close()
    spent = {name: after[name] - before.get(name, 0.0) for name in after}
    extents = steps * (RANKS - 1)
    per = {name: round(cpu * 1e6 / extents, 1) for name, cpu in spent.items() if cpu >= 0.01}
    return {
        "relay": relay,
        "steps": steps,
        "roots": len(whole),
        "complete": sum(1 for n in whole if n == RANKS),
        "us_per_extent_by_thread": per,  # the relayed ranks' extents (8 a step)
        "connections_at_rank0": connections,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    options = parser.parse_args()
    for relay in (True, False):
        print(json.dumps(measure(relay, options.steps)), flush=True)


if __name__ == "__main__":
    main()
