"""A small replay simulator of training jobs, written apart from the analysis (it imports none
of tf_otel): the ground truth for the what-if, the overlap and the group tests.

Usage::

    sim = DataParallel(ranks=4, steps=12, legs=2, slow={1: 2.0})     # rank 1's work x2
    job = sim.job()                        # a JobBuilder with the spans the run would record
    sim.total_ms(), sim.total_ms(slow={})  # the run's length as is and without the slowdown

    pipe = Pipeline(stages=4, replicas=2, micro=4, steps=8, slow_stages={3: 1.74})

Every time is decided here, by the simulation: each rank works for its planned time between
its syncs, a collective completes when its last member arrives (plus its transfer time), a
pipeline transfer when both peers are there (plus the link's latency). ``jitter_us`` moves each
recorded timestamp by up to that much either way after the simulation (recording error, not
a change of what ran); ``overlap_us`` starts each rank's next op up to that much before its
collective ended (GPU streams, float timestamps).
"""

from __future__ import annotations

import random
from typing import Dict, List, Optional, Tuple

from analysis_builders import JobBuilder

Plan = Dict[Tuple[int, int, int], float]  # (step, rank, leg) -> ms of own work


class _Job(JobBuilder):
    """A JobBuilder whose ranks carry the resource attributes the simulation gives them."""

    def __init__(self, job_id: str, world_size: int, resources: Dict[int, Dict[str, str]]):
        super().__init__(job_id, world_size)
        self.resources = resources

    def resource(self, rank: int):
        found = super().resource(rank)
        found.update(self.resources.get(rank, {}))
        return found


def _ranks(which: object) -> Tuple[int, ...]:
    return tuple(which) if isinstance(which, (tuple, list)) else (int(which),)  # type: ignore


class DataParallel:
    """``legs`` pieces of work a step on every rank, an allreduce after each but the last."""

    def __init__(
        self,
        ranks: int = 4,
        steps: int = 12,
        legs: int = 2,
        work_ms: float = 20.0,
        comm_ms: float = 2.0,
        slow: Optional[Dict[int, float]] = None,  # rank -> factor on its work, every step
        # step -> (rank or ranks, +ms on each)
        slow_steps: Optional[Dict[int, Tuple[object, float]]] = None,
        spread: float = 0.05,  # each piece of work varies by up to this share
        hosts: Optional[Dict[int, str]] = None,
        input_ms: float = 0.0,  # every rank waits this long for its batch first (an input span)
        seed: int = 1,
    ) -> None:
        self.ranks, self.steps, self.legs = ranks, steps, legs
        self.input_ms = input_ms
        self.comm_ms = comm_ms
        self.slow = dict(slow or {})
        self.slow_steps = dict(slow_steps or {})
        self.hosts = hosts or {}
        rng = random.Random(seed)
        self.base: Plan = {
            (s, r, leg): work_ms / legs * (1 + rng.uniform(-spread, spread))
            for s in range(steps)
            for r in range(ranks)
            for leg in range(legs)
        }

    def _plan(self, slow: Dict[int, float], slow_steps: Dict[int, Tuple[object, float]]) -> Plan:
        plan = {}
        for (s, r, leg), value in self.base.items():
            value *= slow.get(r, 1.0)
            if s in slow_steps and r in _ranks(slow_steps[s][0]) and leg == 0:
                value += slow_steps[s][1]
            plan[(s, r, leg)] = value
        return plan

    def _run(self, plan: Plan):
        """Per step: per rank its step span, its work pieces and collectives (start, end)."""
        t = 0.0
        steps = []
        for s in range(self.steps):
            clock = {r: t + self.input_ms for r in range(self.ranks)}
            work: Dict[int, List[Tuple[float, float]]] = {r: [] for r in range(self.ranks)}
            colls: Dict[int, List[Tuple[float, float]]] = {r: [] for r in range(self.ranks)}
            for leg in range(self.legs):
                for r in range(self.ranks):
                    start = clock[r]
                    clock[r] = start + plan[(s, r, leg)]
                    work[r].append((start, clock[r]))
                if leg < self.legs - 1:
                    done = max(clock.values()) + self.comm_ms
                    for r in range(self.ranks):
                        colls[r].append((clock[r], done))
                        clock[r] = done
            end = max(clock.values())
            steps.append((t, {r: clock[r] for r in range(self.ranks)}, work, colls))
            t = end + 1.0  # the next step begins once every rank is done (the input barrier)
        return steps, t

    def total_ms(self, slow=None, slow_steps=None) -> float:
        plan = self._plan(
            self.slow if slow is None else slow,
            self.slow_steps if slow_steps is None else slow_steps,
        )
        steps, _ = self._run(plan)
        return sum(max(ends.values()) - start for start, ends, _, _ in steps)

    def job(self, jitter_us: float = 0.0, overlap_us: float = 0.0, seed: int = 2) -> JobBuilder:
        rng = random.Random(seed)

        def j(value: float) -> float:
            return round(value + rng.uniform(-jitter_us, jitter_us) / 1000.0, 6)

        resources = {r: {"host.name": h} for r, h in self.hosts.items()}
        job = _Job("sim-dp", self.ranks, resources)
        steps, _ = self._run(self._plan(self.slow, self.slow_steps))
        for s, (start, ends, work, colls) in enumerate(steps):
            step = job.step(s)
            for r in range(self.ranks):
                step.rank(r, j(start), j(ends[r]))
                if self.input_ms:
                    step.span(r, "input", "IteratorGetNext", j(start), j(start + self.input_ms))
                for leg, (a, b) in enumerate(work[r]):
                    early = rng.uniform(0, overlap_us) / 1000.0 if leg else 0.0
                    step.span(r, "compute", f"work{leg}", j(a - early), j(b))
                for k, (a, b) in enumerate(colls[r]):
                    step.collective(r, f"s{s}/g{k}", j(a), j(b))
        return job


class Pipeline:
    """A GPipe schedule: ``stages`` x ``replicas`` ranks (rank = replica * stages + stage),
    ``micro`` micro-batches forward through the stages then backward, each stage's replicas
    allreducing their gradients at the end of the step."""

    def __init__(
        self,
        stages: int = 4,
        replicas: int = 2,
        micro: int = 4,
        steps: int = 8,
        fwd_ms: float = 4.0,
        link_ms: float = 0.5,
        comm_ms: float = 2.0,
        slow_stages: Optional[Dict[int, float]] = None,
        seed: int = 3,
    ) -> None:
        self.stages, self.replicas, self.micro, self.steps = stages, replicas, micro, steps
        self.fwd_ms, self.link_ms, self.comm_ms = fwd_ms, link_ms, comm_ms
        self.slow_stages = dict(slow_stages or {})
        rng = random.Random(seed)
        self.noise = {
            (s, r, m, d): rng.uniform(0.97, 1.03)
            for s in range(steps)
            for r in range(stages * replicas)
            for m in range(micro)
            for d in (0, 1)
        }

    def rank(self, replica: int, stage: int) -> int:
        return replica * self.stages + stage

    def _op_ms(self, step: int, rank: int, m: int, backward: int, slow: Dict[int, float]) -> float:
        stage = rank % self.stages
        base = self.fwd_ms * (2 if backward else 1)
        return base * slow.get(stage, 1.0) * self.noise[(step, rank, m, backward)]

    def _run(self, slow: Dict[int, float]):
        t = 0.0
        out = []
        world = self.stages * self.replicas
        for s in range(self.steps):
            free = {r: t for r in range(world)}
            ops: Dict[int, list] = {r: [] for r in range(world)}
            recvs: Dict[int, list] = {r: [] for r in range(world)}
            sends: Dict[int, list] = {r: [] for r in range(world)}
            for replica in range(self.replicas):
                ready: Dict[Tuple[int, int, int], float] = {}  # (stage, m, dir) -> data there
                # each stage's ops in its own order: forwards by micro-batch, then backwards
                per_stage = {
                    st: [(st, m, d) for d in (0, 1) for m in range(self.micro)]
                    for st in range(self.stages)
                }
                pending = {st: list(ops_) for st, ops_ in per_stage.items()}
                while any(pending.values()):
                    progressed = False
                    for st in range(self.stages):
                        if not pending[st]:
                            continue
                        _, m, d = pending[st][0]
                        source = st - 1 if d == 0 else st + 1
                        needs = 0 <= source < self.stages and not (d == 1 and st == self.stages - 1)
                        if needs and (st, m, d) not in ready:
                            continue
                        r = self.rank(replica, st)
                        start = free[r]
                        if needs:
                            arrival = ready[(st, m, d)]
                            edge = f"s{s}/p{replica}/{d}/{m}/{source}->{st}"
                            recvs[r].append((edge, start, max(start, arrival)))
                            start = max(start, arrival)
                        end = start + self._op_ms(s, r, m, d, slow)
                        ops[r].append((f"{'bwd' if d else 'fwd'}{m}", start, end))
                        free[r] = end
                        target = st + 1 if d == 0 else st - 1
                        if d == 0 and st == self.stages - 1:
                            target = -1  # the last stage turns the micro-batch around itself
                        if 0 <= target < self.stages:
                            edge = f"s{s}/p{replica}/{d}/{m}/{st}->{target}"
                            sends[r].append((edge, end, end + self.link_ms))
                            ready[(target, m, d)] = end + self.link_ms
                        pending[st].pop(0)
                        progressed = True
                    assert progressed, "the schedule deadlocked"
            # each stage's replicas allreduce their gradients
            coll: Dict[int, Tuple[float, float]] = {}
            for st in range(self.stages):
                members = [self.rank(p, st) for p in range(self.replicas)]
                done = max(free[r] for r in members) + self.comm_ms
                for r in members:
                    coll[r] = (free[r], done)
                    free[r] = done
            out.append((t, dict(free), ops, recvs, sends, coll))
            t = max(free.values()) + 1.0
        return out

    def total_ms(self, slow_stages=None) -> float:
        runs = self._run(self.slow_stages if slow_stages is None else slow_stages)
        return sum(max(ends.values()) - start for start, ends, *_ in runs)

    def job(self, jitter_us: float = 0.0, seed: int = 4) -> JobBuilder:
        rng = random.Random(seed)

        def j(value: float) -> float:
            return round(value + rng.uniform(-jitter_us, jitter_us) / 1000.0, 6)

        world = self.stages * self.replicas
        resources = {
            r: {"pipeline.stage": str(r % self.stages), "host.name": f"node{r}"}
            for r in range(world)
        }
        job = _Job("sim-pipe", world, resources)
        for s, (start, ends, ops, recvs, sends, coll) in enumerate(self._run(self.slow_stages)):
            step = job.step(s)
            for r in range(world):
                step.rank(r, j(start), j(ends[r]))
                for name, a, b in ops[r]:
                    step.span(r, "compute", name, j(a), j(b))
                for edge, a, b in recvs[r] + sends[r]:
                    step.span(
                        r,
                        "transfer",
                        "RecvTensor",
                        j(a),
                        j(b),
                        **{"tensorflow.transfer.edge": edge},
                    )
                a, b = coll[r]
                step.collective(r, f"s{s}/stage{r % self.stages}", j(a), j(b))
        return job
