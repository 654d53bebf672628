"""The carry rule: a rank whose last collective of step N - 1 ended late begins step N late
without being late itself (docs/guides/ANALYSIS.md, "What a rank carries into the next step").

Seen on the ground-truth ``slowlink`` scenario: in the ring all-reduce the slow link delivers
one rank's last chunk ~48 ms after the others have theirs; that rank ends every step late and
begins the next late, and was named persistently late for it. Built here without TF: every rank
begins its step where its own previous step ended (not on a common clock), so what a rank does
late at the end of a step really moves its next step.
"""

from __future__ import annotations

import json
import random
import statistics
from typing import Dict, Optional, Tuple

import pytest
from analysis_builders import JobBuilder, decoded_spans, ms

from tf_otel.analysis.analyze import analyze_source, analyze_spans
from tf_otel.analysis.load.spill import load_spilled
from tf_otel.analysis.path.carry import CARRIED_NAME, _beyond_others
from tf_otel.analysis.report.json_report import to_json

LATE_RANK = 1
DELAY_MS = 40.0


def chained_run(
    steps: int = 24,
    world_size: int = 4,
    collective_late_ms: float = 0.0,
    tail_ms: float = 0.0,
    before_ms: float = 0.0,
    jitter_ms: float = 1.0,
    collective_every: int = 1,
    slow: Optional[Dict[int, Tuple[int, float]]] = None,
    late_ranks: Tuple[int, ...] = (LATE_RANK,),
    seed: int = 11,
) -> JobBuilder:
    """Per rank and step: a 0.5 ms gap after its own previous step, an input wait, 10 ms of its
    own step work (a gap), one allreduce that completes 5 ms after the last arrival, a 1 ms tail.

    ``collective_late_ms``: the allreduce of ``late_ranks`` ends that much after the others'
    (the slow link's last chunk). ``tail_ms``: those ranks work that long after their allreduce,
    inside their step (their own lateness). ``before_ms``: those ranks wait that long before each
    step, after their previous one ended (a sleep: their own lateness). ``collective_every``:
    collective spans only on steps divisible by it (the others synchronise unseen, as with
    TF_OTEL_HOROVOD_EVERY=N; 0: on none); the timing is the same.
    ``slow``: step -> (rank, ms): that rank's own step work is that much longer in that step.
    """
    rng = random.Random(seed)
    job = JobBuilder("job-carry", world_size=world_size)
    free = dict.fromkeys(range(world_size), 0.0)  # where each rank's previous step ended
    for number in range(steps):
        step = job.step(number)
        plan: Dict[int, tuple] = {}
        slow_rank, extra = (slow or {}).get(number, (-1, 0.0))
        for rank in range(world_size):
            gap = 0.5 + (before_ms if rank in late_ranks else 0.0)
            start = round(free[rank] + gap + rng.uniform(0, jitter_ms), 3)
            input_end = round(start + 1.0 + rng.uniform(0, jitter_ms / 4), 3)
            work = 10.0 + rng.uniform(0, jitter_ms) + (extra if rank == slow_rank else 0.0)
            arrive = round(input_end + work, 3)
            plan[rank] = (start, input_end, arrive)
        last_ready = max(arrive for _, _, arrive in plan.values())
        done = round(last_ready + 5.0, 3)
        for rank, (start, input_end, arrive) in plan.items():
            late = rank in late_ranks
            finished = round(done + (collective_late_ms if late else 0.0), 3)
            end = round(
                finished + 1.0 + rng.uniform(0, jitter_ms / 4) + (tail_ms if late else 0), 3
            )
            step.rank(rank, start, end)
            step.span(rank, "input", "IteratorGetNext (tf.data)", start, input_end)
            if collective_every and number % collective_every == 0:
                last = {"horovod.last_arrival": arrive == last_ready}
                step.collective(rank, f"s{number}/grad", arrive, finished, **last)
            free[rank] = end
    return job


def persistent(result) -> Dict[int, int]:
    return result.stragglers.noise.persistent()


def named_steps(result) -> Dict[int, int]:
    return {r.trace.step: r.straggler.rank for r in result.steps if r.straggler}


def test_a_rank_whose_last_collective_ended_late_is_not_late_in_the_next_step():
    result = analyze_spans(decoded_spans(chained_run(collective_late_ms=DELAY_MS)))
    assert persistent(result) == {}
    assert not [f for f in result.findings if f.rule in ("persistent_lateness", "straggler")]
    assert named_steps(result) == {}
    # every step but the first inherits 40 ms on rank 1: none of it is its own lateness
    for step in result.steps[1:]:
        assert abs(step.path.lateness_by_rank()[LATE_RANK]) < ms(2.0), step.trace.step
    # on the path the time rank 1 was still in its previous step's allreduce is communication
    # (it was receiving its last chunk), not before_step: that keeps only its own ~2 ms from
    # the collective's end to its next step (its 1 ms tail, the 0.5-1.5 ms gap)
    steady = result.steady_steps[1:]
    assert statistics.median(s.path.by_category()["before_step"] for s in steady) < ms(3.0)
    carried = [
        seg
        for s in steady
        for seg in s.path.segments
        if seg.rank == LATE_RANK and seg.name.startswith("(previous step)")
    ]
    assert len(carried) == len(steady)
    assert all(seg.category == "communication" for seg in carried)
    # from the step's start (the first rank's, 1.5-2.75 ms after its own collective ended)
    assert all(ms(DELAY_MS - 3.0) <= seg.duration_ns <= ms(DELAY_MS - 1.5) for seg in carried)


def test_own_work_after_the_last_collective_is_still_persistent_lateness():
    # version 1 of the rule carried the previous step span's end and hid exactly this
    result = analyze_spans(decoded_spans(chained_run(tail_ms=DELAY_MS)))
    late = persistent(result)
    assert list(late) == [LATE_RANK]
    assert ms(DELAY_MS - 5.0) <= late[LATE_RANK] <= ms(DELAY_MS + 5.0)
    finding = next(f for f in result.findings if f.rule == "persistent_lateness")
    assert finding.evidence["rank"] == LATE_RANK
    assert 35.0 <= finding.evidence["median_lateness_ms"] <= 45.0


def test_control_names_nothing():
    result = analyze_spans(decoded_spans(chained_run()))
    assert persistent(result) == {}
    assert named_steps(result) == {}
    assert not [f for f in result.findings if f.rule in ("persistent_lateness", "straggler")]
    for step in result.steps:
        assert not [seg for seg in step.path.segments if seg.name.startswith("(previous step)")]


def _arrivals_counted(step) -> bool:
    """Whether the straggler statistics counted collective arrivals in the step."""
    assert step.path.arrival_tally is not None
    return bool(step.path.arrival_tally[0])


def test_a_step_without_collective_spans_takes_off_what_the_rank_inherited():
    # collective spans on even steps only: an odd step has none (the path's no-collective
    # rule) but its previous step shows rank 1's allreduce ending 40 ms late
    job = chained_run(collective_late_ms=DELAY_MS, collective_every=2)
    result = analyze_spans(decoded_spans(job))
    odd = [s for s in result.steps if s.trace.step % 2]
    assert odd and all(not _arrivals_counted(s) for s in odd)
    for step in odd:
        assert abs(step.path.lateness_by_rank()[LATE_RANK]) < ms(2.0), step.trace.step


def test_only_the_step_numbered_one_less_is_carried_from():
    # a gap in the step numbers (steps sampled every other one): nothing to carry from
    job = chained_run(collective_late_ms=DELAY_MS, steps=8)
    job.steps = [s for s in job.steps if s.step != 3]
    result = analyze_spans(decoded_spans(job))
    by_number = {s.trace.step: s for s in result.steps}
    assert by_number[4].path.lateness_by_rank()[LATE_RANK] > ms(DELAY_MS - 3.0)
    assert abs(by_number[5].path.lateness_by_rank()[LATE_RANK]) < ms(2.0)


def test_a_slowed_step_is_named_with_its_own_delay_only():
    # the compute ground truth (a rank's own extra work, named with that delay) beside the carry:
    # rank 2 slowed by 60 ms in step 10 (rank 1 begins 40 ms late there, so the step waits 20 ms
    # more; rank 2 was ready 60 ms after the others' median) is named with 60 ms; rank 1, slowed
    # by 30 ms in step 16 while it inherits 40 ms every step, with 30 ms, not 70
    slow = {10: (2, 60.0), 16: (LATE_RANK, 30.0)}
    result = analyze_spans(decoded_spans(chained_run(collective_late_ms=DELAY_MS, slow=slow)))
    found = {r.trace.step: r.straggler for r in result.steps if r.straggler}
    assert sorted(found) == [10, 16]
    for number, (rank, delay) in slow.items():
        straggler = found[number]
        assert (straggler.rank, straggler.category) == (rank, "compute")
        assert abs(straggler.excess_ns - ms(delay)) <= ms(0.1 * delay)
        assert abs(straggler.excess_by_category_ns["compute"] - ms(delay)) <= ms(0.1 * delay)
    assert persistent(result) == {}


def test_steps_are_matched_by_root_name_and_not_when_ambiguous():
    # TF1: each fetch signature numbers its own steps, and every rank's step span is named
    # "Session.run"; the root's name (<key> step <n>) tells them apart
    from tf_otel.analysis.path.carry import previous_steps
    from tf_otel.analysis.steps import group_steps

    # two signatures, steps 0-3 each (two builder jobs: their own trace ids)
    train = decoded_spans(chained_run(steps=4))
    evaluation = JobBuilder("job-carry-eval", world_size=4)
    for number in range(4):
        step = evaluation.step(number)
        for rank in range(4):
            step.rank(rank, 1000.0 + 20 * number, 1010.0 + 20 * number)
    steps, _ = group_steps(train + decoded_spans(evaluation))
    for step in steps:
        key = "session_run:loss,train" if step.job_id == "job-carry" else "session_run:accuracy"
        step.root.name = f"{key} step {step.step}"
        for timeline in step.ranks.values():
            timeline.step_span.name = "Session.run"
    found = previous_steps(steps)
    assert len(found) == 6
    for trace_id, previous in found.items():
        step, before = next(s for s in steps if s.trace_id == trace_id), previous.trace
        assert (before.job_id, before.step) == (step.job_id, step.step - 1)
    for step in steps:  # no roots: both keys read "Session.run", every number twice
        step.root = None
    assert previous_steps(steps) == {}


def test_a_slowed_step_is_named_with_no_more_than_the_step_waited_for():
    # ranks 1 and 3 inherit 40 ms every step; rank 2 does 100 ms more work in step 10. Its own
    # extra work is 100 ms, but it was ready only ~60 ms after the others' median (ranks 1 and
    # 3 began 40 ms late): the step waited 60 ms for it, and that is what it is named with
    slow = {10: (2, 100.0)}
    job = chained_run(collective_late_ms=DELAY_MS, slow=slow, late_ranks=(1, 3))
    result = analyze_spans(decoded_spans(job))
    found = {r.trace.step: r.straggler for r in result.steps if r.straggler}
    assert sorted(found) == [10]
    assert (found[10].rank, found[10].category) == (2, "compute")
    assert abs(found[10].excess_ns - ms(60.0)) <= ms(3.0)
    assert persistent(result) == {}


# Collective detail on 1 step in N (TF_OTEL_HOROVOD_EVERY): a detail step's previous step has
# step spans but no collective spans, so what a rank inherited is read from its previous step
# span's end (how much later than the others' median it ended, at most how late it began).
SAMPLED_EVERY = 4  # collective spans on steps 0, 4, 8, ...: each detail step stands alone


def detail_steps(result):
    return [s for s in result.steps if s.trace.step % SAMPLED_EVERY == 0 and s.trace.step]


def test_a_detail_step_after_one_without_collective_spans_carries_the_step_span_end():
    # the slow link: rank 1's allreduce ends 40 ms late every step (recorded on detail steps
    # only): its step span ends 40 ms late and it begins the next step 40 ms late. Before the
    # step span rule a detail step carried nothing and rank 1 was persistently late by ~40 ms;
    # the evidence step (this one, or the nearest detail step) shows its allreduce ending late
    # too, so the step span carry stands
    job = chained_run(steps=48, collective_late_ms=DELAY_MS, collective_every=SAMPLED_EVERY)
    result = analyze_spans(decoded_spans(job))
    assert persistent(result) == {}
    assert named_steps(result) == {}
    assert not [f for f in result.findings if f.rule in ("persistent_lateness", "straggler")]
    detail = detail_steps(result)
    assert len(detail) == 11 and all(_arrivals_counted(s) for s in detail)
    for step in result.steps[1:]:  # also the steps without collective spans after one
        assert abs(step.path.lateness_by_rank()[LATE_RANK]) < ms(2.0), step.trace.step
    # the path keeps that time before rank 1's step: what it was doing is not recorded
    for step in detail:
        assert not [seg for seg in step.path.segments if seg.name.startswith("(previous step)")]
        assert ms(DELAY_MS - 3.0) <= step.path.by_category()["before_step"] <= ms(DELAY_MS + 1)


def test_sampled_detail_control_names_nothing():
    job = chained_run(steps=48, collective_every=SAMPLED_EVERY)
    result = analyze_spans(decoded_spans(job))
    assert persistent(result) == {}
    assert named_steps(result) == {}
    assert not [f for f in result.findings if f.rule in ("persistent_lateness", "straggler")]
    for step in result.steps[1:]:
        assert abs(step.path.lateness_by_rank()[LATE_RANK]) < ms(2.0), step.trace.step


def test_a_late_start_after_a_step_span_that_ended_on_time_is_the_ranks_own():
    # rank 1 sleeps 40 ms before every step; its previous step span ends with the others'. On
    # top of a 40 ms late allreduce end it begins 80 ms late and only the 40 ms is inherited
    for collective_late in (0.0, DELAY_MS):
        job = chained_run(
            steps=48,
            collective_late_ms=collective_late,
            before_ms=DELAY_MS,
            collective_every=SAMPLED_EVERY,
        )
        result = analyze_spans(decoded_spans(job))
        late = persistent(result)
        assert list(late) == [LATE_RANK], collective_late
        assert ms(DELAY_MS - 3.0) <= late[LATE_RANK] <= ms(DELAY_MS + 3.0)
        for step in detail_steps(result):
            lateness = step.path.lateness_by_rank()[LATE_RANK]
            assert ms(DELAY_MS - 3.0) <= lateness <= ms(DELAY_MS + 3.0), step.trace.step


def test_the_step_span_carry_is_the_smallest_of_its_three_bounds():
    # one previous step without collective spans: rank 1's span ends 40 ms after the others'
    # median, rank 2's 10 ms; in the next step rank 1 begins 15 ms late (it caught up), rank 2
    # 30 ms late (it slept 20 ms). The next step's allreduce ends `late` ms after the others' on
    # ranks 1 and 2 (the evidence: 50 ms, beyond both; then 5 ms on rank 1 only): each
    # inherits the smallest of the three
    from tf_otel.analysis.path.carry import carried_into
    from tf_otel.analysis.steps import group_steps

    ends = {0: 100.0, 1: 140.0, 2: 110.0, 3: 100.0}
    starts = {0: 101.0, 1: 116.0, 2: 131.0, 3: 101.0}

    def carried(late: Dict[int, float], before_collectives: bool = False):
        job = JobBuilder("job-carry-bound", world_size=4)
        before, after = job.step(0), job.step(1)
        for rank in range(4):
            before.rank(rank, 0.0, ends[rank])
            if before_collectives:
                before.collective(rank, "s0/grad", 50.0, 60.0 + (5.0 if rank == 1 else 0.0))
            after.rank(rank, starts[rank], 300.0)
            after.collective(rank, "s1/grad", 180.0, 190.0 + late.get(rank, 0.0))
        steps, _ = group_steps(decoded_spans(job))
        previous, step = sorted(steps, key=lambda s: s.step)
        return carried_into(step, previous)

    found = carried({1: 50.0, 2: 50.0})
    assert sorted(found) == [0, 1, 2, 3]
    assert not any(c.collective for c in found.values())
    assert {c.evidence_step for c in found.values()} == {1}
    assert {r: round(c.inherited_ns / 1e6, 3) for r, c in found.items()} == {
        0: 0.0,
        1: 15.0,
        2: 10.0,
        3: 0.0,
    }
    # rank 1's allreduce ends 5 ms late in the evidence step, rank 2's on time: rank 2's late
    # step span end was its own work after its allreduce, and only 5 ms of rank 1's is carried
    found = carried({1: 5.0})
    assert {r: round(c.inherited_ns / 1e6, 3) for r, c in found.items()} == {
        0: 0.0,
        1: 5.0,
        2: 0.0,
        3: 0.0,
    }
    # a previous step with collective spans carries from their end, as before
    found = carried({1: 50.0, 2: 50.0}, before_collectives=True)
    assert all(c.collective and c.evidence_step is None for c in found.values())
    assert {r: round(c.inherited_ns / 1e6, 3) for r, c in found.items()} == {
        0: 0.0,
        1: 5.0,
        2: 0.0,
        3: 0.0,
    }


def test_the_evidence_step_is_the_step_itself_else_the_nearest_detail_step():
    # detail (collective spans) on steps 0, 4, 8, 9: each step after one without collective
    # spans takes its own if it has them, else the nearest detail step's (the later of two as
    # near); a step after a detail step needs none
    from tf_otel.analysis.path.carry import previous_steps
    from tf_otel.analysis.steps import group_steps

    job = chained_run(steps=12)
    for step in job.steps:
        if step.step not in (0, 4, 8, 9):
            step.spans = [s for s in step.spans if s.attributes["tf_otel.category"] != "collective"]
    steps, _ = group_steps(decoded_spans(job))
    found = {p.trace.step + 1: p for p in previous_steps(steps).values()}
    evidence = {n: p.evidence.step if p.evidence else None for n, p in sorted(found.items())}
    assert evidence == {
        1: None,  # after detail step 0
        2: 4,  # 0 and 4 as near: the later
        3: 4,
        4: 4,  # its own
        5: None,
        6: 8,  # 4 and 8 as near: the later
        7: 8,
        8: 8,
        9: None,
        10: None,
        11: 9,  # none later
    }


def test_own_work_after_the_last_collective_with_sampled_detail():
    # rank 1 works 40 ms after its allreduce every step (a slow optimizer apply): its step span
    # ends 40 ms late and it begins the next step 40 ms late, as behind a slow link. Its
    # allreduce ends on time in the evidence step (this step, or the nearest detail step), so
    # nothing is carried from the step span and it is late by its 40 ms in every step. With
    # the step span end alone (b9f4df2) that was carried and rank 1 was named only in the steps
    # right after a detail step: not persistently late. On top of a 40 ms late allreduce end
    # (the slow link as well) it begins 80 ms late and only the 40 ms the evidence shows is
    # carried
    for collective_late in (0.0, DELAY_MS):
        job = chained_run(
            steps=48,
            tail_ms=DELAY_MS,
            collective_late_ms=collective_late,
            collective_every=SAMPLED_EVERY,
        )
        result = analyze_spans(decoded_spans(job))
        late = persistent(result)
        assert list(late) == [LATE_RANK], collective_late
        assert ms(DELAY_MS - 5.0) <= late[LATE_RANK] <= ms(DELAY_MS + 5.0), collective_late
        finding = next(f for f in result.findings if f.rule == "persistent_lateness")
        assert finding.evidence["rank"] == LATE_RANK
        assert 35.0 <= finding.evidence["median_lateness_ms"] <= 45.0
        for step in result.steps[1:]:
            lateness = step.path.lateness_by_rank()[LATE_RANK]
            assert ms(DELAY_MS - 3.0) <= lateness <= ms(DELAY_MS + 3.0), step.trace.step
            # the step ends on rank 1's own work after its allreduce
            last = step.path.segments[-1]
            assert (last.rank, last.category) == (LATE_RANK, "compute")
            assert last.duration_ns >= ms(DELAY_MS)


def test_a_job_without_collective_spans_carries_nothing():
    # collective detail off: no step would measure rank 1's own work after its allreduce
    # against the allreduce's end, so carrying step span ends would hide it in every step
    job = chained_run(steps=48, tail_ms=DELAY_MS, collective_every=0)
    result = analyze_spans(decoded_spans(job))
    late = persistent(result)
    assert list(late) == [LATE_RANK]
    assert ms(DELAY_MS - 3.0) <= late[LATE_RANK] <= ms(DELAY_MS + 3.0)


@pytest.mark.parametrize("every", [1, SAMPLED_EVERY])
@pytest.mark.parametrize("spilled", [False, True], ids=["memory", "spilled"])
def test_a_picture_read_again_carries_what_the_analysis_carried(every, spilled, tmp_path):
    # spilled, each analysed step waits on disk without its collectives (StepTrace.strip): a
    # picture's carry reads its previous (and evidence) step again and must find the same path
    job = chained_run(steps=24, collective_late_ms=DELAY_MS, collective_every=every)
    if spilled:
        path = tmp_path / "job.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in job.otlp_lines()))
        with load_spilled([str(path)], progress=False, workers=1) as source:
            result = analyze_source(source)
            assert all(step.trace.stripped for step in result.steps)
            _pictures_carry_the_same(result)
    else:
        _pictures_carry_the_same(analyze_spans(decoded_spans(job)))


@pytest.mark.parametrize("every", [1, SAMPLED_EVERY])
@pytest.mark.parametrize("shuffled", [False, True], ids=["in_order", "shuffled"])
def test_steps_analysed_as_they_are_built_carry_what_a_second_pass_carries(
    every, shuffled, tmp_path, monkeypatch
):
    """One process over spilled traces analyses each step as it is built, with the step before
    it as the steps met so far give it; the match over all steps decides which of those stand
    (the others are analysed in a second pass): the same report, carry and all, as two passes.
    Lines shuffled: steps met before the one before them. Sampled detail: a step after one
    without collectives needs its evidence step, which may come later: the second pass."""
    from analysis_oracles import TwoPasses

    from tf_otel.analysis import analyze

    job = chained_run(steps=24, collective_late_ms=DELAY_MS, collective_every=every)
    lines = _lines_by_trace(job.otlp_lines())  # a rank's step a line
    if shuffled:
        random.Random(5).shuffle(lines)
    path = tmp_path / "job.jsonl"
    path.write_text("\n".join(lines) + "\n")
    analyse = analyze.analyze_batch
    reports, second = {}, {}
    for one_pass in (True, False):
        second[one_pass] = 0

        def counted(task, one_pass=one_pass):
            second[one_pass] += len(task[3])
            return analyse(task)

        monkeypatch.setattr(analyze, "analyze_batch", counted)
        with load_spilled([str(path)], progress=False, workers=1) as source:
            result = analyze_source(source, engine=None if one_pass else TwoPasses())
            reports[one_pass] = json.dumps(to_json(result, True), sort_keys=True)
            carried = sum(leg.inherited_ns > 0 for r in result.steps for leg in r.path.legs)
    assert reports[True] == reports[False]
    assert carried, "nothing carried: the test would show nothing"
    assert second[False] == 24
    if every == 1 and not shuffled:
        assert second[True] == 0  # every step analysed as it was built
    else:
        assert 0 < second[True] < 24, second


def _lines_by_trace(documents) -> list:
    """OTLP-JSON lines of one resource and one trace each (a rank's step)."""
    lines = []
    for document in documents:
        for group in document["resourceSpans"]:
            for scope in group["scopeSpans"]:
                by_trace: Dict[str, list] = {}
                for span in scope["spans"]:
                    by_trace.setdefault(span["traceId"], []).append(span)
                for spans in by_trace.values():
                    one = {"resource": group["resource"], "scopeSpans": [{**scope, "spans": spans}]}
                    lines.append(json.dumps({"resourceSpans": [one]}))
    return lines


def _pictures_carry_the_same(result):
    carried = 0
    for step in result.steps:
        again = result.with_spans(step)
        assert not again.trace.slimmed
        assert again.path.segments == step.path.segments, step.label
        assert again.path.lateness_by_rank() == step.path.lateness_by_rank(), step.label
        carried += sum(s.name.startswith(CARRIED_NAME) for s in step.path.segments)
        carried += sum(leg.inherited_ns > 0 for leg in again.path.legs)
    assert carried, "nothing carried: the test would show nothing"


def test_each_ranks_lateness_over_the_others_median_matches_leaving_it_out() -> None:
    """_beyond_others (one sort a step) against the definition, a median of the other ranks
    taken for each rank: nanosecond times (the float the median of an even count is taken as
    rounds them alike), ties, two ranks, one."""
    rng = random.Random(11)
    base = 1_795_847_135_591_021_254
    for _ in range(1500):
        ranks = rng.randint(1, 9)
        values = {
            r: base + rng.choice([0, 1, 3, 1_000, 1_000, 250_000, 10**9]) for r in range(ranks)
        }
        expected = {
            rank: max(0, v - int(statistics.median([o for r, o in values.items() if r != rank])))
            if len(values) > 1
            else 0
            for rank, v in values.items()
        }
        assert _beyond_others(values) == expected, values
