"""Hand-built step traces for the analysis tests, and their OTLP-JSON / Jaeger encodings.

Usage::

    job = JobBuilder("job-1", world_size=2)
    step = job.step(3)
    step.rank(0, 0, 100)                       # the rank's step span, times in milliseconds
    step.span(0, "compute", "matmul", 0, 40)
    step.collective(0, "grad0", 40, 100)
    lines = job.otlp_lines()                   # one TracesData per rank (resource), as dicts
    jaeger = job.jaeger_document()             # {"data": [trace, ...]}

Times are milliseconds (at most 3 decimals) from a fixed epoch, so the Jaeger encoding
(microseconds) is exact.
Ids follow the contract: trace id = sha256("<job>/step/<n>")[:16], root = ".../root"[:8].
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional

EPOCH_NS = 1_700_000_000 * 10**9


def _digest(text: str, size: int) -> str:
    return hashlib.sha256(text.encode()).digest()[:size].hex()


def _value(value: Any) -> Dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def _jaeger_tag(key: str, value: Any) -> Dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value}
    return {"key": key, "type": "string", "value": str(value)}


class BuiltSpan:
    def __init__(self, trace_id, span_id, parent_id, name, start_ms, end_ms, rank, attributes):
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.name = name
        self.start_ns = EPOCH_NS + round(start_ms * 1_000_000)
        self.end_ns = EPOCH_NS + round(end_ms * 1_000_000)
        self.rank = rank  # None: the root (rank 0's resource)
        self.attributes = attributes


class StepBuilder:
    def __init__(self, job: JobBuilder, step: int) -> None:
        self.job = job
        self.step = step
        self.trace_id = _digest(f"{job.job_id}/step/{step}", 16)
        self.root_id = _digest(f"{job.job_id}/step/{step}/root", 8)
        self.spans: List[BuiltSpan] = []
        self.step_spans: Dict[int, BuiltSpan] = {}
        self.with_root = True
        self.root_name: Optional[str] = None  # "<step key> step <n>" names its series
        self._count = 0

    def _id(self) -> str:
        self._count += 1
        return _digest(f"{self.trace_id}/{self._count}", 8)

    def _add(self, rank, category, name, start, end, parent, **attributes) -> BuiltSpan:
        attrs = {"tf_otel.category": category, "tf_otel.rank": rank, "tf_otel.step": self.step}
        attrs.update(attributes)
        span = BuiltSpan(self.trace_id, self._id(), parent, name, start, end, rank, attrs)
        self.spans.append(span)
        return span

    def rank(self, rank: int, start: float, end: float) -> BuiltSpan:
        span = self._add(
            rank,
            "step",
            "train_step",
            start,
            end,
            self.root_id,
            **{"tf_otel.step.kind": "tf_function"},
        )
        self.step_spans[rank] = span
        return span

    def span(
        self,
        rank: int,
        category: str,
        name: str,
        start: float,
        end: float,
        parent: Optional[BuiltSpan] = None,
        **attributes: Any,
    ) -> BuiltSpan:
        parent_id = (parent or self.step_spans[rank]).span_id
        return self._add(rank, category, name, start, end, parent_id, **attributes)

    def collective(
        self,
        rank: int,
        key: str,
        start: float,
        end: float,
        wait_end: Optional[float] = None,
        **attributes: Any,
    ) -> BuiltSpan:
        attrs = {"tf_otel.collective.key": key, "horovod.op": "allreduce"}
        attrs.update(attributes)
        span = self.span(rank, "collective", f"allreduce.{key}", start, end, **attrs)
        if wait_end is not None:
            self.span(rank, "collective.wait", "wait", start, wait_end, parent=span)
            self.span(rank, "collective.transfer", "transfer", wait_end, end, parent=span)
        return span

    def root_span(self) -> Optional[BuiltSpan]:
        if not self.with_root or not self.step_spans:
            return None
        start = min(s.start_ns for s in self.step_spans.values())
        end = max(s.end_ns for s in self.step_spans.values())
        attrs = {
            "tf_otel.category": "step.root",
            "tf_otel.rank": 0,
            "tf_otel.step": self.step,
            "tf_otel.step.ranks": len(self.step_spans),
            "tf_otel.world_size": self.job.world_size,
        }
        root = BuiltSpan(
            self.trace_id,
            self.root_id,
            None,
            self.root_name or f"step {self.step}",
            0,
            0,
            None,
            attrs,
        )
        root.start_ns, root.end_ns = start, end
        return root

    def all_spans(self) -> List[BuiltSpan]:
        root = self.root_span()
        return ([root] if root else []) + self.spans


class JobBuilder:
    def __init__(self, job_id: str = "job-1", world_size: int = 2) -> None:
        self.job_id = job_id
        self.world_size = world_size
        self.steps: List[StepBuilder] = []

    def step(self, number: int) -> StepBuilder:
        builder = StepBuilder(self, number)
        self.steps.append(builder)
        return builder

    def resource(self, rank: int) -> Dict[str, Any]:
        return {
            "service.name": "train.py",
            "host.name": f"host{rank}",
            "tf_otel.rank": rank,
            "tf_otel.world_size": self.world_size,
            "tf_otel.job.id": self.job_id,
        }

    def spans_by_rank(self) -> Dict[int, List[BuiltSpan]]:
        by_rank: Dict[int, List[BuiltSpan]] = {}
        for step in self.steps:
            for span in step.all_spans():
                by_rank.setdefault(0 if span.rank is None else span.rank, []).append(span)
        return dict(sorted(by_rank.items()))

    def otlp_lines(self) -> List[Dict[str, Any]]:
        lines = []
        for rank, spans in self.spans_by_rank().items():
            encoded = []
            for span in spans:
                item = {
                    "traceId": span.trace_id,
                    "spanId": span.span_id,
                    "name": span.name,
                    "kind": 1,
                    "startTimeUnixNano": str(span.start_ns),
                    "endTimeUnixNano": str(span.end_ns),
                    "attributes": [
                        {"key": k, "value": _value(v)} for k, v in span.attributes.items()
                    ],
                    "status": {},
                }
                if span.parent_id:
                    item["parentSpanId"] = span.parent_id
                encoded.append(item)
            resource = [{"key": k, "value": _value(v)} for k, v in self.resource(rank).items()]
            lines.append(
                {
                    "resourceSpans": [
                        {
                            "resource": {"attributes": resource},
                            "scopeSpans": [{"scope": {"name": "tf_otel"}, "spans": encoded}],
                        }
                    ]
                }
            )
        return lines

    def write_otlp(self, path) -> None:
        with open(path, "w") as handle:
            for line in self.otlp_lines():
                handle.write(json.dumps(line) + "\n")

    def jaeger_traces(self) -> List[Dict[str, Any]]:
        traces = []
        for step in self.steps:
            processes = {}
            spans = []
            for span in step.all_spans():
                rank = 0 if span.rank is None else span.rank
                process_id = f"p{rank + 1}"
                resource = self.resource(rank)
                processes[process_id] = {
                    "serviceName": resource.pop("service.name"),
                    "tags": [_jaeger_tag(k, v) for k, v in resource.items()],
                }
                references = []
                if span.parent_id:
                    references.append(
                        {"refType": "CHILD_OF", "traceID": span.trace_id, "spanID": span.parent_id}
                    )
                spans.append(
                    {
                        "traceID": span.trace_id,
                        "spanID": span.span_id,
                        "operationName": span.name,
                        "references": references,
                        "startTime": span.start_ns // 1000,
                        "duration": (span.end_ns - span.start_ns) // 1000,
                        "tags": [_jaeger_tag(k, v) for k, v in span.attributes.items()],
                        "logs": [],
                        "processID": process_id,
                        "warnings": None,
                    }
                )
            traces.append({"traceID": step.trace_id, "spans": spans, "processes": processes})
        return traces


def decoded_spans(job: JobBuilder):
    """The job's spans through the real OTLP-JSON decoder (JSON text round trip included)."""
    from tf_otel.analysis.load.otlp import decode_traces_data

    spans = []
    for number, line in enumerate(job.otlp_lines(), start=1):
        spans.extend(decode_traces_data(json.loads(json.dumps(line)), f"built line {number}"))
    return spans


def ms(value: float) -> int:
    """Milliseconds (builder units) as nanoseconds."""
    return round(value * 1_000_000)


def horovod_like_run(
    world_size: int = 4,
    steps: int = 30,
    slow: Optional[Dict[int, tuple]] = None,
    jitter_ms: float = 2.0,
    warmup_ms: float = 0.0,
    unknown_arrivals: bool = False,
    seed: int = 7,
    job_id: str = "job-hvd",
    collectives: bool = True,
) -> JobBuilder:
    """A run shaped like a traced Horovod custom loop without op detail: per rank and step an
    input wait, the rank's own step work (no spans: a gap), one allreduce, a short tail.

    ``slow``: step -> (rank, delay_ms, kind) with kind ``before_step`` (the rank starts the
    step late), ``input`` (its input wait is longer) or ``compute`` (its step work is longer).
    Every rank's times jitter by up to ``jitter_ms`` (a seeded ``random.Random``); step 0 takes
    ``warmup_ms`` more on every rank's step work (tracing). ``unknown_arrivals``: ranks other
    than 0 carry Horovod's cache-hit view: ``horovod.arrival=unknown`` and a span starting when
    the last rank became ready. ``collectives=False``: no collective spans at all (step spans
    only, as with TF_OTEL_HOROVOD=0).
    """
    import random

    rng = random.Random(seed)
    slow = slow or {}
    job = JobBuilder(job_id, world_size=world_size)
    t = 0.0
    for number in range(steps):
        step = job.step(number)
        slow_rank, delay, kind = slow.get(number, (-1, 0.0, ""))
        plan = {}
        for rank in range(world_size):
            extra = delay if rank == slow_rank else 0.0
            start = (
                t + round(rng.uniform(0, jitter_ms), 3) + (extra if kind == "before_step" else 0)
            )
            input_end = start + 1.0 + round(rng.uniform(0, jitter_ms / 4), 3)
            input_end += extra if kind == "input" else 0.0
            work = 10.0 + round(rng.uniform(0, jitter_ms), 3) + (extra if kind == "compute" else 0)
            work += warmup_ms if number == 0 else 0.0
            plan[rank] = (round(start, 3), round(input_end, 3), round(input_end + work, 3))
        last_ready = max(arrive for _, _, arrive in plan.values())
        done = round(last_ready + 5.0, 3)
        for rank, (start, input_end, arrive) in plan.items():
            end = round(done + 1.0 + rng.uniform(0, jitter_ms / 4), 3)
            step.rank(rank, start, end)
            step.span(rank, "input", "IteratorGetNext (tf.data)", start, input_end)
            attributes: Dict[str, Any] = {"horovod.last_arrival": arrive == last_ready}
            span_start = arrive
            if unknown_arrivals and rank != 0:
                attributes = {"horovod.arrival": "unknown", "horovod.last_arrival": False}
                span_start = last_ready
            elif unknown_arrivals:
                attributes = {"horovod.arrival": "negotiate", "horovod.last_arrival": False}
            if collectives:
                step.collective(rank, f"s{number}/grad", span_start, done, **attributes)
        t = round((max(s.end_ns for s in step.step_spans.values()) - EPOCH_NS) / 1e6 + 0.5, 3)
    return job


def synthetic_overview(ranks: int = 64, steps: int = 10_000, seed: int = 5):
    """An ``Overview`` of a big run without building its spans: step times drifting around
    100 ms, a 3 s warm-up step 0, a checkpoint every 1,000 steps, a few ranks slowed now and
    then (rank 17 often, by 30-80 ms: its input), seeded and exact."""
    import random

    from tf_otel.analysis.report.overview import Overview

    rng = random.Random(seed)
    threshold = ms(12.0)
    lateness = {rank: [0] * steps for rank in range(ranks)}
    durations, stragglers, outliers = [], [], []
    for step in range(steps):
        base = ms(100.0 + 10.0 * (step / steps) + rng.uniform(-2.0, 2.0))
        for rank in range(ranks):
            lateness[rank][step] = round(rng.gauss(0, 1.5) * 1e6)
        straggler = None
        if step and (step % 97 == 0 or rng.random() < 0.01):
            rank = 17 if rng.random() < 0.6 else rng.randrange(ranks)
            delay = ms(rng.uniform(30.0, 80.0))
            lateness[rank][step] = delay
            base += delay
            straggler = (rank, delay, delay - ms(2.0), "input" if rank == 17 else "compute")
        if step == 0:
            base = ms(3000.0)
        elif step % 1000 == 0:
            base += ms(400.0)  # a checkpoint
        durations.append(base)
        stragglers.append(straggler)
        outliers.append(step > 0 and step % 1000 == 0)
    return Overview(
        title=f"synthetic run, {ranks} ranks x {steps} steps",
        labels=[str(n) for n in range(steps)],
        durations_ns=durations,
        ranks=list(range(ranks)),
        lateness=lateness,
        threshold_ns=threshold,
        warmup=[n == 0 for n in range(steps)],
        outlier=outliers,
        straggler=stragglers,
    )
