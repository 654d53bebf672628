"""Stragglers beyond the run's own noise, warm-up, bounds and categories, on hand-built runs."""

from __future__ import annotations

import json
import random

from analysis_builders import EPOCH_NS, JobBuilder, decoded_spans, horovod_like_run, ms

from tf_otel.analysis.analyze import analyze_spans
from tf_otel.analysis.report.json_report import to_json
from tf_otel.analysis.stragglers import warmup_keys


def stragglers(result):
    return {r.trace.step: r.straggler for r in result.steps if r.straggler}


def test_jitter_above_any_fixed_share_names_nobody():
    # 3 ms of jitter on ~17 ms steps: the old 5 % / 1 ms rule named a rank in most steps
    result = analyze_spans(decoded_spans(horovod_like_run(steps=40, jitter_ms=3.0)))
    assert stragglers(result) == {}
    assert not [f for f in result.findings if f.rule == "straggler"]
    noise = result.stragglers.noise
    assert noise.sigma_ns > 0 and noise.threshold_ns > ms(3.0)


def test_slowed_steps_named_with_rank_category_and_delay():
    slow = {10: (2, 40.0, "before_step"), 20: (1, 40.0, "input"), 30: (3, 40.0, "compute")}
    result = analyze_spans(decoded_spans(horovod_like_run(steps=40, jitter_ms=2.0, slow=slow)))
    found = stragglers(result)
    assert sorted(found) == [10, 20, 30]
    for number, (rank, delay, kind) in slow.items():
        straggler = found[number]
        assert straggler.rank == rank and straggler.category == kind
        assert abs(straggler.excess_by_category_ns[kind] - ms(delay)) <= ms(0.1 * delay)
        assert abs(straggler.excess_ns - ms(delay)) <= ms(0.1 * delay)


def test_warmup_is_reported_and_kept_out():
    job = horovod_like_run(steps=20, jitter_ms=1.0, warmup_ms=3000.0)
    # rank 0 traces longest: without warm-up detection it is the run's headline straggler
    first = job.steps[0]
    for span in first.spans:
        if span.rank == 0 and span.attributes["tf_otel.category"] == "collective":
            span.start_ns -= 0  # arrival unchanged; the step is long on every rank
    result = analyze_spans(decoded_spans(job))
    assert [s.trace.step for s in result.warmup_steps] == [0]
    assert result.steps[0].straggler is None and not result.steps[0].outlier
    assert result.outliers.outliers == []
    assert [f.rule for f in result.findings if f.rule in ("straggler", "step_outliers")] == []
    document = to_json(result)
    assert document["summary"]["warmup_steps"] == [0]
    assert document["steps"][0]["warmup"] is True


def test_short_runs_between_warm_up_steps_do_not_end_the_warm_up():
    """tf_cnn_benchmarks (4 ranks, its 2 warm-up batches): the init run, a 0.2 s read of the
    global step, the two slow warm-up batches, another short read, then ~0.5 s steps (step
    durations in ms as analysed, in order). The warm-up is the init run and both batches; the
    short reads are not warm-up, and a run with neither slow batch has none."""
    steady = [585, 570, 565, 493, 587, 590, 551, 525, 522, 532, 468, 462, 480, 488, 457, 456]
    steady += [489, 503, 464, 475, 487, 520, 568, 511]
    run = [3025, 211, 2785, 2572, 18] + steady
    assert warmup_keys({key: ms(d) for key, d in enumerate(run)}) == [0, 2, 3]
    control = [211, 18] + steady
    assert warmup_keys({key: ms(d) for key, d in enumerate(control)}) == []
    ordinary = [3025, 540, 2785] + steady  # an ordinary step ends it: the later one is kept
    assert warmup_keys({key: ms(d) for key, d in enumerate(ordinary)}) == [0]


def test_without_op_detail_the_gaps_are_rank_step_work():
    result = analyze_spans(decoded_spans(horovod_like_run(steps=5, jitter_ms=0.0)))
    split = result.by_category()
    assert split["framework"] == 0
    assert split["compute"] > split["communication"] > 0
    names = {s.name for r in result.steps for s in r.path.segments if s.category == "compute"}
    assert names == {"(rank step work)"}


def test_unknown_arrivals_blame_the_rank_whose_work_explains_the_wait():
    slow = {6: (2, 60.0, "before_step"), 12: (3, 60.0, "input")}
    job = horovod_like_run(steps=16, jitter_ms=1.0, slow=slow, unknown_arrivals=True)
    found = stragglers(analyze_spans(decoded_spans(job)))
    assert sorted(found) == [6, 12]
    assert (found[6].rank, found[6].category) == (2, "before_step")
    assert (found[12].rank, found[12].category) == (3, "input")
    for number in (6, 12):
        assert abs(found[number].excess_by_category_ns[found[number].category] - ms(60)) <= ms(6)


def test_unknown_arrival_without_evidence_blames_nobody():
    # rank 3's own step work is slow, but its arrival is hidden: nothing it is known to have
    # done explains the wait, so nobody is named (rather than a wrong rank)
    slow = {6: (3, 60.0, "compute")}
    job = horovod_like_run(steps=16, jitter_ms=1.0, slow=slow, unknown_arrivals=True)
    result = analyze_spans(decoded_spans(job))
    assert stragglers(result) == {}
    assert any("response cache" in w for w in result.warnings)
    assert result.steps[6].path.by_category()["straggler_wait"] > ms(50)  # 60 ms - jitter


def test_overlapping_collectives_keep_excess_and_what_if_in_bounds():
    # rank 0 arrives at B before A completes: its A->B leg is negative; the old legs gave an
    # excess above the step's duration and a negative what-if
    job = JobBuilder("j", world_size=2)
    for number in range(4):
        step = job.step(number)
        base = number * 200
        late = 50 if number == 2 else 0
        step.rank(0, base, base + 100 + late)
        step.collective(0, f"A{number}", base + 5, base + 60 + late)
        step.collective(0, f"B{number}", base + 10, base + 100 + late)
        step.rank(1, base, base + 100 + late)
        step.span(1, "compute", "fwd", base, base + 50 + late)
        step.collective(1, f"A{number}", base + 50 + late, base + 60 + late)
        step.span(1, "compute", "more", base + 60 + late, base + 90 + late)
        step.collective(1, f"B{number}", base + 90 + late, base + 100 + late)
    result = analyze_spans(decoded_spans(job))
    for step in result.steps:
        if step.straggler:
            assert step.straggler.excess_ns <= step.trace.duration_ns
            assert step.straggler.saving_ns <= step.straggler.excess_ns
        assert 0 <= step.what_if_ns <= step.trace.duration_ns


def test_json_is_deterministic_whatever_the_input_order():
    slow = {5: (1, 30.0, "input")}
    spans = decoded_spans(horovod_like_run(steps=12, slow=slow))
    first = json.dumps(to_json(analyze_spans(spans, source="x")), sort_keys=False)
    shuffled = list(spans)
    random.Random(3).shuffle(shuffled)
    second = json.dumps(to_json(analyze_spans(shuffled, source="x")), sort_keys=False)
    assert first == second
    assert EPOCH_NS > 0


def test_without_collective_spans_the_rank_ready_last_is_blamed():
    # step spans and input waits only: the sync is unseen; the rank whose own known work ended
    # last (a late start, a long input wait) held the others up
    slow = {6: (2, 50.0, "before_step"), 11: (1, 50.0, "input")}
    job = horovod_like_run(steps=16, jitter_ms=1.0, slow=slow, collectives=False)
    result = analyze_spans(decoded_spans(job))
    found = stragglers(result)
    assert sorted(found) == [6, 11]
    assert (found[6].rank, found[6].category) == (2, "before_step")
    assert (found[11].rank, found[11].category) == (1, "input")
    for step in result.steps:
        assert step.path.length_ns == step.trace.duration_ns
    control = analyze_spans(decoded_spans(horovod_like_run(steps=16, collectives=False)))
    assert stragglers(control) == {}


def _named_roots(spans, names):
    for span in spans:
        if span.category == "step.root":
            span.name = f"{names(span.step)} step {span.step}"
    return spans


def test_steps_of_other_step_functions_are_labelled_with_theirs():
    """A TF1 program runs several Session.run fetch sets, each numbering its steps from 0
    (tf_cnn_benchmarks: its init run, reads of the global step, the training step): the steps
    of all but the step function with the most steps carry its short name ("global_step:0" in
    the text, "series" in JSON); a job of one step function (the control) keeps plain numbers."""
    job = horovod_like_run(steps=12, jitter_ms=1.0)
    other = {0, 5}
    names = lambda n: "session_run:global_step" if n in other else "session_run:loss,train_op"  # noqa: E731
    result = analyze_spans(_named_roots(decoded_spans(job), names))
    labels = [s.label for s in result.steps]
    assert labels == ["global_step:0"] + [str(n) for n in range(1, 5)] + ["global_step:5"] + [
        str(n) for n in range(6, 12)
    ]
    document = to_json(result)
    assert [s.get("series") for s in document["steps"]] == [
        "global_step" if n in other else None for n in range(12)
    ]
    control = analyze_spans(_named_roots(decoded_spans(job), lambda n: "session_run:train_op"))
    assert [s.label for s in control.steps] == [str(n) for n in range(12)]
    assert all("series" not in s for s in to_json(control)["steps"])


def test_last_arrival_and_the_others_median_match_their_definitions():
    """The strictly last rank and the others' median, taken at C speed, against the plain
    definitions (sorted by time then rank; the median of the others), ties included."""
    import statistics

    from tf_otel.analysis.stragglers import _median_others, _strictly_last

    rng = random.Random(5)
    for _ in range(2000):
        values = {
            r: rng.choice((rng.randint(0, 4), rng.randint(0, 10**12)))
            for r in range(rng.randint(0, 9))
        }
        ordered = sorted(values.items(), key=lambda item: (-item[1], item[0]))
        unique = len(ordered) >= 2 and ordered[0][1] > ordered[1][1]
        assert _strictly_last(values) == (ordered[0][0] if unique else None), values
        for rank in values if len(values) >= 2 else ():
            others = [v for r, v in values.items() if r != rank]
            assert _median_others(values, rank) == int(statistics.median(others)), values
