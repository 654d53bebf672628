"""The stall record rank 0 exports: every rank classified against the stalled step from its
answer (missing, waiting and where, done, silent), the collectives the step holds, and the text
of the span and log line (cluster.stall gathers the answers; this module only builds).

Usage::

    built = build_record(key, step, world_size, age_ns, threshold_ns, report, answers, connected)
    built.attributes, built.summary          # the stall span's attributes, the log line
    resolved_record(key, step, duration_ns, threshold_ns, reports, error)   # the closing one
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from tf_otel import record
from tf_otel.cluster import messages

ANSWER_WAIT_S = 2.0  # how long rank 0 waits for the answers (the silent ranks' line says it)
MAX_DETAIL_RANKS = 32  # ranks with their own line and stack in one record
MAX_STACK_LINES = 24  # frames rendered per rank in the record
MAX_LINE_CHARS = 240
SILENT = "did not answer within {:.0f} s (stuck in C++ holding the GIL, or dead)"
UNCONNECTED = "not connected to rank 0 (dead, or never reached rank 0)"
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tf_otel/


def frame_lines(stack: Sequence[Sequence[Any]]) -> List[str]:
    """A stack as "function (file.py:line)" lines, innermost first."""
    return [_frame_text(frame)[:MAX_LINE_CHARS] for frame in stack]


def ranks_text(ranks: Sequence[int]) -> str:
    """0,1,2,3,7 -> "0-3,7"."""
    parts: List[str] = []
    run: List[int] = []
    for rank in sorted(ranks):
        if run and rank == run[-1] + 1:
            run.append(rank)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [rank]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts) or "none"


def _frame_text(frame: Sequence[Any]) -> str:
    return f"{frame[0]} ({os.path.basename(str(frame[1]))}:{frame[2]})"


def _is_program(frame: Sequence[Any]) -> bool:
    """A frame of the program's own code: not a library's, not tf_otel's, not the interpreter's."""
    path = str(frame[1])
    if path.startswith("<") or path.startswith(_OWN_DIR + os.sep):
        return False
    return not any(part in path for part in ("site-packages", "dist-packages", "/lib/python"))


def place(stack: Sequence[Sequence[Any]]) -> str:
    """Where a stack stands: its innermost frame, the Horovod function it is in where one is on
    the stack, and the program's own frame that called it."""
    if not stack:
        return "no Python stack"
    text = _frame_text(stack[0])
    horovod = next((f for f in stack if f"{os.sep}horovod{os.sep}" in str(f[1])), None)
    if horovod is not None:
        text = f"horovod {horovod[0]}: {text}"
    program = next((f for f in stack[1:] if _is_program(f)), None)
    if program is not None:
        text += f" called from {_frame_text(program)}"
    return text


def _seconds(ns: int) -> str:
    return f"{ns / 1e9:.1f} s"


@dataclass
class StallRecord:
    """What rank 0 exports for one report: span attributes and the log line's text."""

    attributes: Dict[str, Any]
    summary: str
    missing: List[int] = field(default_factory=list)
    waiting: List[int] = field(default_factory=list)
    silent: List[int] = field(default_factory=list)


def build_record(
    key: str,
    step: int,
    world_size: int,
    age_ns: int,
    threshold_ns: int,
    report: int,
    answers: Dict[int, messages.Message],
    connected: Set[int],
    answer_wait_s: float = ANSWER_WAIT_S,
    rank0_in_step: bool = True,
    ranks: Optional[Sequence[int]] = None,
) -> StallRecord:
    """Classify every rank against step ``step`` of ``key`` (rank 0's step in flight, or with
    ``rank0_in_step`` False the other ranks' step that rank 0 has not begun):
    waiting (inside that step), missing (not reached it: its in-flight step is another one and
    its last completed step of the key is before it), done (finished it), silent (no answer).
    ``ranks``: the ranks of the step's world where they are not 0..``world_size`` - 1 (Horovod
    Elastic, cluster/world.py)."""
    missing: List[int] = []
    waiting: List[int] = []
    done: List[int] = []
    idle: List[int] = []
    silent: List[int] = []
    lines: Dict[int, str] = {}
    for rank in range(world_size) if ranks is None else ranks:
        answer = answers.get(rank)
        if answer is None:
            silent.append(rank)
            why = SILENT.format(answer_wait_s) if rank in connected else UNCONNECTED
            lines[rank] = f"rank {rank}: {why}"
            continue
        flight, last = answer.get("f"), answer.get("d")
        here = place(answer.get("s") or []) + _last_collective(answer)
        if flight is not None and flight[0] == key and flight[1] == step:
            waiting.append(rank)
            lines[rank] = f"rank {rank}: in step {step} for {_seconds(flight[2])}, at {here}"
        elif (last is not None and last[0] == key and last[1] >= step) or (
            flight is not None and flight[0] == key and flight[1] > step
        ):  # finished it (and maybe in a later one: rank 0 itself may hold the step)
            done.append(rank)
            now = "" if flight is None else f", in step {flight[1]} of {flight[0]}"
            finished = step if last is None or last[0] != key else last[1]
            lines[rank] = f"rank {rank}: finished step {finished}{now}, at {here}"
        elif flight is None and last is None and step > 0:
            # never began any step while the others did `step` of them: not a stepping rank
            # (a parameter server), since a collective partner would have held step 0
            idle.append(rank)
            lines[rank] = f"rank {rank}: has never stepped (not a stepping rank?), at {here}"
        else:
            missing.append(rank)
            if last is not None and last[0] == key:
                had = f"last completed step {last[1]} {_seconds(last[2])} ago"
            elif last is not None:
                had = f"last completed step {last[1]} of {last[0]} {_seconds(last[2])} ago"
            else:
                had = "no step of it completed"
            inside = "" if flight is None else f", in step {flight[1]} of {flight[0]}"
            lines[rank] = f"rank {rank}: has not reached step {step} ({had}{inside}), at {here}"
    by_place: Dict[str, List[int]] = OrderedDict()
    for rank in waiting:
        by_place.setdefault(place(answers[rank].get("s") or []), []).append(rank)
    blocked = [f"ranks {ranks_text(ranks)}: {where_}" for where_, ranks in by_place.items()]
    held_count, held = _step_collectives(waiting, answers)
    detail = (missing + silent + waiting + done + idle)[:MAX_DETAIL_RANKS]
    stacks = []
    for rank in detail:
        answer = answers.get(rank)
        if answer is None:
            continue
        frames = answer.get("s") or []
        shown = [f"  {_frame_text(f)}"[:MAX_LINE_CHARS] for f in frames[:MAX_STACK_LINES]]
        more = len(frames) - len(shown)
        tail = [f"  ... {more} outer frames"] if more > 0 else []
        stacks.append("\n".join([f"rank {rank} (innermost first):"] + shown + tail))
    attributes: Dict[str, Any] = {
        record.ATTR_CATEGORY: record.STALL,
        record.ATTR_RANK: 0,
        record.ATTR_STEP: step,
        record.ATTR_STEP_KEY: key,
        record.ATTR_STALL_STATE: record.STALLED,
        record.ATTR_STALL_DURATION: age_ns,
        record.ATTR_STALL_THRESHOLD: threshold_ns,
        record.ATTR_STALL_REPORT: report,
        record.ATTR_STALL_MISSING: missing,
        record.ATTR_STALL_WAITING: waiting,
        record.ATTR_STALL_SILENT: silent,
        record.ATTR_STALL_BLOCKED_IN: blocked,
        record.ATTR_STALL_RANKS: [lines[rank][: MAX_LINE_CHARS * 2] for rank in detail],
        record.ATTR_STALL_STACKS: stacks,
    }
    if held_count:
        attributes[record.ATTR_STALL_COLLECTIVES] = held
        attributes[record.ATTR_STALL_COLLECTIVE_COUNT] = held_count
    named = [lines[rank] for rank in missing[:MAX_DETAIL_RANKS]]
    held_by = "rank 0 has been in it" if rank0_in_step else "ranks have been in it"
    if not rank0_in_step:
        attributes[record.ATTR_STALL_RANK0_BETWEEN] = True
    summary = (
        f"tf_otel: step {step} of {key} stalls: {held_by} {_seconds(age_ns)} "
        f"(threshold {_seconds(threshold_ns)}, report {report}). "
        f"Not in the step: {'; '.join(named) if named else 'no rank'}. "
        f"Waiting in it: {'; '.join(blocked) if blocked else 'no rank'}. "
        f"Did not answer: {ranks_text(silent)}."
    )
    if held_count:
        rest = f" and {held_count - len(held)} more" if held_count > len(held) else ""
        summary += f" The step's graph holds {held_count} collectives: {', '.join(held)}{rest}"
        # every collective needs every rank: one that never began the step holds them all
        summary += (
            f"; none of them can have completed: ranks {ranks_text(missing)} have not begun it."
            if missing
            else "."
        )
    if done and not missing and not silent and waiting == [0]:
        summary += (
            " Every other rank finished the step: rank 0 itself holds it "
            f"(ranks {ranks_text(done)} are past it)."
        )
    return StallRecord(attributes, summary, missing, waiting, silent)


def _last_collective(answer: messages.Message) -> str:
    last = answer.get("l")
    if not last:
        return ""
    return f"; its last eager collective, {last[0]} {last[1]}, returned {_seconds(last[2])} ago"


def _step_collectives(
    waiting: Sequence[int], answers: Dict[int, messages.Message]
) -> Tuple[int, List[str]]:
    """The collectives built into the waiting ranks' step (the first waiting rank that knows
    them: every rank runs the same step function), as "op name"."""
    for rank in waiting:
        total, names = (answers[rank].get("c") or [0, []])[:2]
        if total:
            return int(total), [f"{op} {name}" for op, name in names]
    return 0, []


def resolved_record(
    key: str,
    step: int,
    duration_ns: int,
    threshold_ns: int,
    reports: int,
    error: Optional[str],
    rank0_in_step: bool = True,
) -> StallRecord:
    """The record that closes a stall whose step ended: a slow step, with its duration."""
    attributes: Dict[str, Any] = {
        record.ATTR_CATEGORY: record.STALL,
        record.ATTR_RANK: 0,
        record.ATTR_STEP: step,
        record.ATTR_STEP_KEY: key,
        record.ATTR_STALL_STATE: record.RESOLVED,
        record.ATTR_STALL_DURATION: duration_ns,
        record.ATTR_STALL_THRESHOLD: threshold_ns,
        record.ATTR_STALL_REPORT: reports,
    }
    ended = f"ended with {error}" if error else "ended"
    summary = (
        f"tf_otel: step {step} of {key} is no longer stalled: it {ended} after "
        f"{_seconds(duration_ns)} on rank 0 (threshold {_seconds(threshold_ns)}): a slow step"
    )
    if not rank0_in_step:
        attributes[record.ATTR_STALL_RANK0_BETWEEN] = True
        summary = (
            f"tf_otel: step {step} of {key} is no longer stalled: rank 0 went on after "
            f"{_seconds(duration_ns)} of the other ranks waiting in it "
            f"(threshold {_seconds(threshold_ns)})"
        )
    return StallRecord(attributes, summary)
