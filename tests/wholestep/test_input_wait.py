"""Ground truth for input wait in every API (issue 15): a slow tf.data decode stage of a known
length per batch must show as the step's input share; the same job without it must show ~none.
Keras fit, ``next(it)`` in a tf.function, and ``for x, y in ds`` in a tf.function (AutoGraph's
dataset loop, traced in the graph: issue 23)."""

from __future__ import annotations

import sys
from pathlib import Path
from statistics import median_high
from typing import Any, Dict, List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import base_env, python, run  # noqa: E402

from wholestep.analysis_of import analyze_received  # noqa: E402

pytestmark = pytest.mark.integration

JOB = str(Path(__file__).resolve().parent / "input_job.py")
SLOW_MS = 30.0
STEPS = 24
CONTROL_MODEL_MS = 20.0


def _train_steps(spans, kind):
    steps = [
        s for s in spans if s.category == "step" and s.attributes.get("tf_otel.step.kind") == kind
    ]
    return sorted(steps, key=lambda s: s.attributes["tf_otel.step"])


# input wait is on by default for Keras fit and datasets iterated inside a tf.function; a
# user's own iterator (``loop``: next(it) inside a tf.function) is timed with TF_OTEL_INPUT_WAIT=1
SETTING = {"keras": {}, "graphloop": {}, "loop": {"TF_OTEL_INPUT_WAIT": "1"}}


def _job(receiver, tmp_path, mode, slow_ms, kind, **extra):
    env = base_env(
        **receiver.env("grpc"),
        **SETTING[mode],
        TF_OTEL_ENABLED="1",
        DATA_DIR=str(tmp_path),
        MODE=mode,
        STEPS=str(STEPS),
        SLOW_MS=str(slow_ms),
        **extra,
    )
    result = run([python(), JOB], env)
    assert f"done steps={STEPS}" in result.stdout
    spans = receiver.wait_for(lambda s: len(_train_steps(s, kind)) >= STEPS, 30)
    # the first steps trace and warm the pipeline up: judge the steady state; and what the
    # slow stage really took (a loaded host oversleeps)
    slow: Dict[str, Any] = {
        q: float(result.stdout.split(f"slow_ms_{q}=")[1].split()[0])
        for q in ("median", "p10", "p90")
    }
    ready = result.stdout.split("slow_ready_ns=")[1].split()[0]
    slow["ready_ns"] = [] if ready == "-" else [int(t) for t in ready.split(",")]
    return _train_steps(spans, kind)[4:], slow


def _true_wait_ms(step, ready_ns: List[int]) -> float:
    """What the step really waited for its batch: from its start to the moment the slow stage
    finished the last batch ready before the step ended (0 when that batch was ready before
    the step began). Input-bound, the producer makes batch k+1 while the consumer trains on
    batch k, so the wait is the stage's time less the consumer's own time since the last
    batch; a loaded host stretches the consumer's time (CI: 5-10 ms a step instead of ~1)
    and the wait rightly shrinks by as much."""
    done = [t for t in ready_ns if t <= step.end_ns]
    return max(0.0, (max(done) - step.start_ns) / 1e6) if done else 0.0


@pytest.mark.parametrize("mode, kind", [("keras", "keras_train"), ("loop", "tf_function")])
def test_slow_input_stage_is_the_input_share(receiver, tmp_path, mode, kind):
    steps, slow = _job(receiver, tmp_path, mode, SLOW_MS, kind)
    waits = [s.attributes["tf_otel.input.wait_ns"] / 1e6 for s in steps]
    shares = [s.attributes["tf_otel.input.share"] for s in steps]
    durations = [(s.end_ns - s.start_ns) / 1e6 for s in steps]
    # the decode sleeps SLOW_MS per batch, the model ~1 ms. This host is shared: a sleep can
    # overrun (CI saw 30 ms sleeps take 36) and the consumer's own time stretches (which the
    # producer's next batch overlaps), so each wait is judged against what that step really
    # waited (_true_wait_ms, from the stage's own finishing times). The tail asks for the batch
    # a little after the step's start and takes it a little after the stage ends: on a quiet
    # host within 1 ms, with two busy processes on this 2-core host 0.3-6 ms either way (half of
    # the steps within 1.2 ms). So the typical wait must be the typical truth within 10 % of
    # SLOW_MS, and most steps (not all: a stalled step lets the buffer fill) within 20 %.
    truth = [_true_wait_ms(step, slow["ready_ns"]) for step in steps]
    context = (
        f"stage {slow['median']} ms; (wait, truth, duration): {list(zip(waits, truth, durations))}"
    )
    assert median_high(truth) >= 0.5 * SLOW_MS, context  # input-bound, truly
    errors = sorted(abs(w - t) for w, t in zip(waits, truth))
    assert abs(median_high(waits) - median_high(truth)) <= 0.1 * SLOW_MS, context
    assert errors[int(0.75 * len(errors)) - 1] <= 0.2 * SLOW_MS, context
    true_shares = [t / d for t, d in zip(truth, durations)]
    assert median_high(shares) == pytest.approx(median_high(true_shares), abs=0.1), (
        shares,
        context,
    )
    for step, share, wait, duration in zip(steps, shares, waits, durations):
        assert share == pytest.approx(wait / duration, abs=0.1)
        assert step.attributes["tf_otel.input.elements"] == 1
    inputs = [s for s in receiver.spans() if s.category == "input"]
    assert inputs, "a significant wait gets an input span under its step"
    # the analysis, from the run's spans alone: input-bound, the typical wait the injected one
    result = analyze_received(receiver.spans())
    # by default (issue 23's table: Keras fit read compute 100 %): input is most of the path
    path_input = result.category_shares()["input"].share
    true_share = sum(truth) / sum(durations)
    assert path_input is not None and path_input >= min(0.7, true_share - 0.1), (
        true_share,
        result.category_shares(),
    )
    found = {f.rule: f for f in result.findings}
    assert "input_bound" in found, [f.summary for f in result.findings]
    evidence = found["input_bound"].evidence
    assert evidence["grade"] == "highly", evidence
    # the typical step's true wait (the injected stage less the consumer's own time) over the
    # typical step: the analysis' share within 0.1 and its wait within 10 % of the stage
    typical_ms = median_high(durations)
    typical_truth = median_high(truth)
    assert evidence["share"] == pytest.approx(typical_truth / typical_ms, abs=0.1), (
        typical_truth,
        evidence,
    )
    typical_wait = evidence["by_rank"]["0"]["median_wait_per_step_ms"]
    assert abs(typical_wait - typical_truth) <= 0.1 * SLOW_MS, (typical_truth, evidence)
    # a few hundred bytes read a step for 30 ms of wait: not the reads but the stage after
    assert "decode_bound_input" in found and "io_bound_input" not in found, found


@pytest.mark.parametrize("mode, kind", [("keras", "keras_train"), ("loop", "tf_function")])
def test_fast_input_shows_no_wait(receiver, tmp_path, mode, kind):
    # a model of ordinary size (20 ms a step): a ~1 ms model turns any sub-ms hiccup into a
    # share; CI once read 0.44 ms a step (10 %) on 4.5 ms steps of a prefetched control
    steps, _ = _job(receiver, tmp_path, mode, 0, kind, MODEL_MS=str(CONTROL_MODEL_MS))
    waits = [s.attributes["tf_otel.input.wait_ns"] for s in steps]
    durations = [s.end_ns - s.start_ns for s in steps]
    assert sorted(durations)[len(durations) // 2] >= CONTROL_MODEL_MS * 1e6, durations
    # prefetched batches: only the timing tail's own floor (0.01-0.04 ms a step on this shared
    # 2-core host) and the odd scheduler hiccup
    assert sorted(waits)[len(waits) // 2] < 0.5e6, waits
    assert sum(w > 0.1 * SLOW_MS * 1e6 for w in waits) <= 1, waits
    result = analyze_received(receiver.spans())
    rules = {f.rule for f in result.findings}
    assert not rules & {"input_bound", "io_bound_input", "decode_bound_input"}, [
        f.summary for f in result.findings
    ]


# ``for x, y in ds`` inside a tf.function: each call (one step) iterates LOOP_BATCHES batches of a
# pipeline that restarts with the call (its first batch is made while the consumer waits)
SLOW_LOOP_BATCHES = 4
FAST_LOOP_BATCHES = 64


def _graph_loop(receiver, tmp_path, slow_ms, batches, **extra):
    steps, slow = _job(
        receiver, tmp_path, "graphloop", slow_ms, "tf_function", LOOP_BATCHES=str(batches), **extra
    )
    for step in steps:
        assert step.attributes["tf_otel.input.elements"] == batches, step.attributes
    waits = [s.attributes["tf_otel.input.wait_ns"] / 1e6 for s in steps]
    durations = [(s.end_ns - s.start_ns) / 1e6 for s in steps]
    return steps, waits, durations, slow["median"]


def test_graph_for_loop_slow_input_is_the_wait(receiver, tmp_path):
    steps, waits, durations, slow_ms = _graph_loop(receiver, tmp_path, SLOW_MS, SLOW_LOOP_BATCHES)
    # every batch waits for the slow stage (the loop's model takes well under 1 ms a batch); the
    # pipeline's start in each call adds a few ms, a loaded host (or an oversleep) a little more
    injected = SLOW_LOOP_BATCHES * slow_ms
    assert sorted(waits)[len(waits) // 2] == pytest.approx(injected, rel=0.1), (injected, waits)
    close = [w for w in waits if abs(w - injected) <= 0.15 * injected]
    assert len(close) >= 0.75 * len(waits), (injected, list(zip(waits, durations)))
    for step, wait, duration in zip(steps, waits, durations):
        assert step.attributes["tf_otel.input.share"] == pytest.approx(wait / duration, abs=0.1)
    result = analyze_received(receiver.spans())
    found = {f.rule: f for f in result.findings}
    assert "input_bound" in found, [f.summary for f in result.findings]
    evidence = found["input_bound"].evidence
    assert evidence["grade"] == "highly", evidence
    typical_wait = evidence["by_rank"]["0"]["median_wait_per_step_ms"]
    assert typical_wait == pytest.approx(injected, rel=0.1), (injected, evidence)
    per_batch = evidence["by_rank"]["0"]["median_wait_per_batch_ms"]
    assert per_batch == pytest.approx(slow_ms, rel=0.1), (slow_ms, evidence)


def test_graph_for_loop_fast_input_shows_no_wait(receiver, tmp_path):
    # the batches cached in memory after the first call (a warm-up step): an input that never
    # blocks. A pipeline that restarts with every call and makes its batches as the loop goes is
    # not this control: its start, and a producer no faster than the loop's tiny model, are
    # waits (a loaded host read 0.1-0.5 ms a batch)
    steps, waits, durations, _ = _graph_loop(
        receiver, tmp_path, 0, FAST_LOOP_BATCHES, LOOP_CACHE="1"
    )
    per_batch = sorted(w / FAST_LOOP_BATCHES for w in waits)
    assert per_batch[len(per_batch) // 2] < 0.2, list(zip(waits, durations))
    result = analyze_received(receiver.spans())
    rules = {f.rule for f in result.findings}
    assert not rules & {"input_bound", "io_bound_input", "decode_bound_input"}, [
        f.summary for f in result.findings
    ]


def test_default_leaves_a_users_iterator_checkpointable(receiver, tmp_path):
    """The timing tail makes an iterator's dataset stateful, and tf.data refuses to checkpoint
    such an iterator: by default a user's own iterator is not timed (Keras fit's are), so
    tf.train.Checkpoint(iterator=it) saves and restores as without tf_otel; the fit in the same
    job is timed. The custom loop's steps after it carry no input wait of the tail (not 0: not
    measured there); their eager next() is an input span (instrument/data.py)."""
    env = base_env(
        **receiver.env("grpc"), TF_OTEL_ENABLED="1", DATA_DIR=str(tmp_path), MODE="checkpoint",
        STEPS="8",
    )  # fmt: skip
    result = run([python(), JOB], env)
    assert "checkpoint restored the next element" in result.stdout, result.stdout[-2000:]
    spans = receiver.wait_for(lambda s: len(_train_steps(s, "keras_train")) >= 8, 30)
    steps = _train_steps(spans, "keras_train")
    assert all("tf_otel.input.wait_ns" in s.attributes for s in steps), steps[0].attributes
    spans = receiver.wait_for(lambda s: len(_train_steps(s, "tf_function")) >= 3, 30)
    loop = _train_steps(spans, "tf_function")
    assert len(loop) == 3 and not any("tf_otel.input.wait_ns" in s.attributes for s in loop)
    inputs = {s.parent_id for s in spans if s.name == "IteratorGetNext (tf.data)"}
    assert {s.span_id for s in loop} <= inputs, [s.attributes for s in loop]
