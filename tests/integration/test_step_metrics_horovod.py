"""Step histograms with exemplars from a real `horovodrun -np 2` Keras job into a real OTLP
receiver (issue 16): every step of every rank counted whatever the sampling, exemplars that name
step traces (and the rank's own step span) the same run exported, and a control with sampling
ratio 0 whose histograms carry no exemplar at all."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest
from conftest import base_env, horovodrun, python, run

pytestmark = pytest.mark.integration

STEPS = 12
INPUT_JOB = Path(__file__).resolve().parent.parent / "wholestep" / "input_job.py"
DURATION = "tf_otel.step.duration"
INPUT_WAIT = "tf_otel.step.input_wait.duration"
COLLECTIVE_WAIT = "tf_otel.step.collective_wait.duration"


def _run(receiver, ratio: str, job: str):
    env = base_env(
        **receiver.env("grpc"),
        TF_OTEL_ENABLED="1",
        TF_OTEL_JOB_ID=job,  # the sampled steps are then the same on every run
        TF_OTEL_INPUT_WAIT="1",
        TF_OTEL_HOROVOD_EVERY="1",  # collective detail (and so collective wait) on sampled steps
        TF_OTEL_TWIN_PREPARE="step",  # every picked step detailed (instrument/detail_twin.py)
        OTEL_TRACES_SAMPLER="traceidratio",
        OTEL_TRACES_SAMPLER_ARG=ratio,
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_METRIC_EXPORT_INTERVAL="1000",
        STEPS=str(STEPS),
    )
    result = horovodrun("horovod_keras.py", env)
    for rank in (0, 1):
        assert f"rank {rank} done steps={STEPS}" in result.stdout, result.stdout[-2000:]
    # the final collection of both ranks (at exit) and their last span batches
    points = receiver.wait_for_points(lambda p: len(_final(p, DURATION)) >= 2, 15)
    spans = receiver.wait_for(lambda s: False, 2)
    return points, spans


def _final(points, name) -> Dict[int, object]:
    """The last (cumulative) keras_train point of each rank."""
    last = {}
    for p in points:
        if p.name == name and p.attributes.get("tf_otel.step.kind") == "keras_train":
            last[p.attributes["tf_otel.rank"]] = p
    return last


def _exemplars(points, name) -> List[Tuple[int, str, str, float]]:
    return [
        (p.attributes["tf_otel.rank"], trace, span, value)
        for p in points
        if p.name == name
        for trace, span, value in p.exemplars
    ]


def _step_spans(spans) -> Dict[Tuple[str, str], Tuple[int, float]]:
    """(trace id, span id) of each rank's keras step span -> (rank, duration s)."""
    return {
        (s.trace_id, s.span_id): (s.attributes["tf_otel.rank"], (s.end_ns - s.start_ns) / 1e9)
        for s in spans
        if s.category == "step" and s.attributes.get("tf_otel.step.kind") == "keras_train"
    }


def _detail_steps(spans) -> Dict[int, Set[int]]:
    """Per rank, the steps with a collective span whose arrival is known (collective wait)."""
    out: Dict[int, Set[int]] = defaultdict(set)
    for s in spans:
        known = s.attributes.get("horovod.arrival") not in (None, "unknown")
        if s.category == "collective" and "horovod.wait_ns" in s.attributes and known:
            out[s.attributes["tf_otel.rank"]].add(s.attributes["tf_otel.step"])
    return out


def test_every_step_counted_and_exemplars_open_existing_step_traces(receiver):
    points, spans = _run(receiver, "0.5", "metrics-half")
    steps = _step_spans(spans)
    sampled = {rank: 0 for rank in (0, 1)}
    for rank, _ in steps.values():
        sampled[rank] += 1
    assert 0 < sampled[0] == sampled[1] < STEPS, f"ratio 0.5 samples some steps: {sampled}"

    durations = _final(points, DURATION)
    waits = _final(points, INPUT_WAIT)
    assert sorted(durations) == [0, 1], "one series per rank"
    for rank in (0, 1):
        # every step, sampled or not, once; the job topology on the resource
        assert durations[rank].value[0] == STEPS, (rank, durations[rank].value)
        assert sum(durations[rank].bucket_counts) == STEPS
        assert durations[rank].explicit_bounds[0] == pytest.approx(0.001)
        assert durations[rank].resource["tf_otel.job.id"] == "metrics-half"
        assert durations[rank].resource["tf_otel.rank"] == rank
        assert waits[rank].value[0] == STEPS  # TF_OTEL_INPUT_WAIT=1 measures every fit step

    exemplars = _exemplars(points, DURATION)
    assert exemplars, "sampled steps leave exemplars"
    for rank, trace, span, value in exemplars:
        # an existing step trace, at this very rank's step span, with that span's duration
        assert (trace, span) in steps, (rank, trace, span)
        span_rank, span_s = steps[(trace, span)]
        assert span_rank == rank
        assert value == pytest.approx(span_s, abs=2e-6)  # the span's times are microsecond-cut
    step_traces = {trace for trace, _ in steps}
    for name in (INPUT_WAIT, COLLECTIVE_WAIT):
        for rank, trace, span, _ in _exemplars(points, name):
            assert trace in step_traces and steps[(trace, span)][0] == rank

    # collective wait: exactly the sampled steps whose collectives' arrivals are known
    detail = _detail_steps(spans)
    collective = _final(points, COLLECTIVE_WAIT)
    for rank in (0, 1):
        assert detail[rank], f"rank {rank}: no collective detail in the sampled steps"
        assert collective[rank].value[0] == len(detail[rank])


def test_ratio_zero_histograms_without_exemplars(receiver):
    points, spans = _run(receiver, "0", "metrics-none")
    assert not [s for s in spans if s.category == "step"], "ratio 0: no step trace exists"
    durations = _final(points, DURATION)
    for rank in (0, 1):
        assert durations[rank].value[0] == STEPS
    # no step trace exists, so no exemplar may name one: none at all
    for name in (DURATION, INPUT_WAIT, COLLECTIVE_WAIT):
        assert _exemplars(points, name) == []
    assert not _final(points, COLLECTIVE_WAIT), "no detail step, no collective wait"


def _input_job(receiver, tmp_path, slow_ms: float):
    env = base_env(
        **receiver.env("grpc"),
        TF_OTEL_ENABLED="1",
        TF_OTEL_INPUT_WAIT="1",
        OTEL_TRACES_SAMPLER="traceidratio",
        OTEL_TRACES_SAMPLER_ARG="0",  # no step sampled: the metrics alone measure
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_METRIC_EXPORT_INTERVAL="60000",  # one collection, at exit
        DATA_DIR=str(tmp_path),
        MODE="keras",
        STEPS="24",
        SLOW_MS=str(slow_ms),
    )
    result = run([python(), str(INPUT_JOB)], env)
    assert "done steps=24" in result.stdout
    points = receiver.wait_for_points(lambda p: 0 in _final(p, INPUT_WAIT), 15)
    return _final(points, INPUT_WAIT)[0]


@pytest.mark.parametrize("slow_ms", [30.0, 0.0])
def test_input_wait_histogram_ground_truth(receiver, tmp_path, slow_ms):
    """A decode stage that sleeps 30 ms a batch puts unsampled steps' input wait in the
    20-50 ms bucket; the same job without it, in the first bucket (<= 1 ms)."""
    point = _input_job(receiver, tmp_path, slow_ms)
    assert point.value[0] == 24
    bounds, counts = point.explicit_bounds, point.bucket_counts
    bucket = bounds.index(0.05) if slow_ms else 0  # (0.02, 0.05] or [0, 0.001]
    # a shared 2-core host: the odd step the scheduler stalls lets the prefetch buffer fill
    assert counts[bucket] >= 0.7 * 24, list(zip([0.0] + bounds, counts))
