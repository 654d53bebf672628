"""Rank 0's live verdict on each step: who held it (rank, lateness, category where measured),
judged by the offline analysis' noise model (tf_otel.lateness), and persistent slowdowns.

Usage (the exporter on rank 0, from the coordinator's thread as each step's root goes out)::

    verdicts = LiveVerdicts()
    verdicts.note_arrivals(key, step, {rank: first collective arrival ns})  # detail steps
    verdict = verdicts.judge(key, step, {rank: (start_ns, end_ns, input_wait_ns or None)})
    verdict.rank, verdict.lateness_ns, verdict.category   # None: nobody beyond the noise
    for change in verdict.changes: ...                    # slowdowns that began / ended

What a rank was ready at: its first collective arrival where rank 0 has the step's arrivals
(Horovod collective-detail steps), else its step start plus its input wait. Lateness: ready
minus the other ranks' median. The category splits the named rank's lateness into
``before_step`` (it began the step late), ``input`` (it waited for input longer than the others)
and ``compute`` (the rest; only where arrivals measured it). Without arrivals a rank slower
inside a synchronous step is not visible (every rank ends together): ``measured`` says which.

Noise, as offline: the worst lateness of the key's recent steady steps (WINDOW), median +
NOISE_SIGMAS robust sigmas; a rank is named when its lateness passes that and the step is
delayed beyond the noise. The first WARMUP_STEPS steps of a key are neither judged nor learned
from. A rank late in SLOW_STEPS of the last SLOW_WINDOW judged steps began a slowdown at the
first of them (the step time likewise, rank None); a slowdown's steps stay out of what the noise
is learned from, else they would raise the threshold it is judged by. A run that has not yet
lasted SLOW_MIN_NS (first late step's start to the step's end) is not raised until it has: fast
steps late for a fraction of a second are a blip. Memory: WINDOW steps a
key, MAX_KEYS keys, MAX_ARRIVALS steps of arrivals.
"""

from __future__ import annotations

import statistics
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple

from tf_otel import record
from tf_otel.lateness import MAD_TO_SIGMA, NOISE_SIGMAS, StragglerNoise, noise_of

WARMUP_STEPS = 2
WINDOW = 64  # steady steps a key whose lateness and durations the noise is learned from
MIN_JUDGED = 3  # steady steps in the window before a step is judged
MIN_SETTLED = 16  # steps SLOW_WINDOW old before the noise is learned from those alone
REFRESH_EVERY = 8  # steps between noise updates once the window is full (CPU on rank 0)
MIN_LATENESS_NS = 1_000_000  # as tf-otel analyze's default straggler_min_ns
SLOW_WINDOW = 8
SLOW_STEPS = 6
# a run of late steps shorter than this is a blip, not a slowdown: 6 steps of a few ms are one
# descheduling on a loaded host (CI: steps 58-65 of a 1,000-step control, ~0.3 s); steps of
# 170 ms or more pass it with their 6 steps
SLOW_MIN_NS = 1_000_000_000
MAX_KEYS = 16
MAX_ARRIVALS = 64

BEFORE_STEP, INPUT, COMPUTE = "before_step", "input", "compute"
CATEGORIES = (BEFORE_STEP, INPUT, COMPUTE)
STEP_TIME = None  # the rank of a slowdown of the whole step time

Extent = Tuple[int, int, Optional[int]]  # a rank's step: start, end (reference ns), input wait


@dataclass
class Change:
    """A slowdown that began (at ``since_step``) or ended (at ``step``)."""

    key: str
    rank: Optional[int]  # None: the step time
    began: bool
    since_step: int
    step: int
    lateness_ns: int  # the median lateness (or step time over the usual) while it lasted
    threshold_ns: int
    # the extent (reference ns, every rank) of the step whose trace it belongs in: since_step's
    # when it began, step's when it ended; its span lies inside that step's root
    start_ns: int = 0
    end_ns: int = 0


@dataclass
class Verdict:
    """One step's verdict."""

    key: str
    step: int
    by_rank_ns: Dict[int, int]  # lateness by rank: ready minus the others' median (may be < 0)
    measured: str  # "arrivals" (collective arrivals) or "extents" (step starts, input waits)
    warmup: bool = False  # not judged: the key's first steps
    rank: Optional[int] = None  # the straggler
    lateness_ns: int = 0  # its lateness (at most the step's duration)
    category: Optional[str] = None
    by_category_ns: Dict[str, int] = field(default_factory=dict)
    threshold_ns: int = 0
    changes: List[Change] = field(default_factory=list)
    extent_ns: Tuple[int, int] = (0, 0)  # the step over every rank: first start, last end

    @property
    def judged(self) -> bool:
        return not self.warmup and self.threshold_ns > 0


def _median_others(values: Mapping[int, int], rank: int) -> float:
    return statistics.median(v for r, v in values.items() if r != rank)


def _medians_without_each(values: Mapping[int, int]) -> Dict[int, float]:
    """For every rank, the median of the other ranks' values: one sort, O(n log n) (a median
    per rank of the n-1 others would be O(n^2 log n): 0.2 s a step at 1,024 ranks)."""
    ordered = sorted((v, r) for r, v in values.items())
    n = len(ordered) - 1  # how many values each median is taken over

    def kth(k: int, without: int) -> int:  # the k-th smallest once position `without` is out
        return ordered[k if k < without else k + 1][0]

    out = {}
    for position, (_, rank) in enumerate(ordered):
        if n % 2:
            out[rank] = float(kth(n // 2, position))
        else:
            out[rank] = (kth(n // 2 - 1, position) + kth(n // 2, position)) / 2
    return out


@dataclass
class _Slowdown:
    """One rank's (or the step time's) recent steps: late or not, and an open slowdown."""

    # step, late, value, the step's extent
    recent: Deque[Tuple[int, bool, int, Tuple[int, int]]] = field(
        default_factory=lambda: deque(maxlen=SLOW_WINDOW)
    )
    since: Optional[int] = None  # the step it began at, while open
    since_extent: Tuple[int, int] = (0, 0)  # that step's extent
    values: List[int] = field(default_factory=list)  # lateness while open (bounded)
    # a run of late steps long enough in steps, not yet in time: its first step and lateness
    pending: Optional[Tuple[int, bool, int, Tuple[int, int]]] = None
    pending_values: List[int] = field(default_factory=list)

    @property
    def held(self) -> bool:
        """Open, or a run of late steps waiting for SLOW_MIN_NS: kept out of the noise."""
        return self.since is not None or self.pending is not None

    def update(self, step: int, late: bool, value: int, extent: Tuple[int, int]) -> Optional[bool]:
        """True: it began now; False: it ended now; None: no change."""
        self.recent.append((step, late, value, extent))
        lates = [entry for entry in self.recent if entry[1]]
        if self.since is None:
            if len(lates) < SLOW_STEPS:
                self.pending, self.pending_values = None, []
                return None
            if self.pending is None:
                self.pending = self._run_start()
                self.pending_values = [e[2] for e in lates if e[0] >= self.pending[0]]
            elif late and len(self.pending_values) < 4 * WINDOW:
                self.pending_values.append(value)
            if extent[1] - self.pending[3][0] < SLOW_MIN_NS:
                return None
            self.since, self.since_extent = self.pending[0], self.pending[3]
            self.values, self.pending, self.pending_values = self.pending_values, None, []
            return True
        if len(self.values) < 4 * WINDOW:
            self.values.append(value)
        if len(self.recent) == SLOW_WINDOW and SLOW_WINDOW - len(lates) >= SLOW_STEPS:
            return False
        return None

    def _run_start(self) -> Tuple[int, bool, int, Tuple[int, int]]:
        """The first late step of the run that ends the window: a late step with two on-time
        steps after it is noise before the slowdown, not its start (a loaded host's rank late
        once at step 27, then slowed from 30: it began at 30)."""
        start = None
        on_time = 0
        for entry in reversed(self.recent):
            if entry[1]:
                start, on_time = entry, 0
            else:
                on_time += 1
                if on_time >= 2 and start is not None:
                    break
        return start if start is not None else self.recent[-1]  # never: called with lates


class _Key:
    """What rank 0 learned of one step key."""

    def __init__(self) -> None:
        self.seen = 0
        self.window: Deque[Tuple[int, Dict[int, int]]] = deque(maxlen=WINDOW)  # step, lateness
        self.durations: Deque[Tuple[int, int]] = deque(maxlen=WINDOW)  # step, duration
        self.noise = StragglerNoise()
        self.step_noise = (0, 0)  # typical step, threshold over it
        self.since_refresh = REFRESH_EVERY
        self.slow: Dict[Optional[int], _Slowdown] = {}


class LiveVerdicts:
    """Rank 0's verdicts, bounded in memory (see the module docstring)."""

    def __init__(self, min_ns: int = MIN_LATENESS_NS) -> None:
        self.min_ns = min_ns
        # roots go out from whichever coordinator thread completed their step: one at a time
        self._lock = threading.Lock()
        self._keys: OrderedDict[str, _Key] = OrderedDict()
        self._arrivals: OrderedDict[Tuple[str, int], Dict[int, int]] = OrderedDict()

    def note_arrivals(self, key: str, step: int, first_arrival: Mapping[int, int]) -> None:
        """A collective-detail step's first collective arrival by rank (reference ns)."""
        with self._lock:
            self._arrivals[(key, step)] = dict(first_arrival)
            while len(self._arrivals) > MAX_ARRIVALS:
                self._arrivals.popitem(last=False)

    def judge(self, key: str, step: int, extents: Mapping[int, Extent]) -> Optional[Verdict]:
        """The step's verdict; None where fewer than two ranks reported it."""
        with self._lock:
            return self._judge_step(key, step, extents)

    def _judge_step(self, key: str, step: int, extents: Mapping[int, Extent]) -> Optional[Verdict]:
        arrivals = self._arrivals.pop((key, step), None)
        if len(extents) < 2:
            return None
        if arrivals is not None and not set(extents) <= set(arrivals):
            arrivals = None  # a rank's arrivals are missing: judge every rank alike
        ready = {
            r: arrivals[r] if arrivals is not None else start + (wait or 0)
            for r, (start, _, wait) in extents.items()
        }
        others = _medians_without_each(ready)
        lateness = {r: int(v - others[r]) for r, v in ready.items()}
        verdict = Verdict(key, step, lateness, "arrivals" if arrivals is not None else "extents")
        first = min(e[0] for e in extents.values())
        last = max(e[1] for e in extents.values())
        verdict.extent_ns = (first, last)
        state = self._state(key)
        state.seen += 1
        if state.seen <= WARMUP_STEPS:
            verdict.warmup = True
            return verdict
        duration = last - first
        if len(state.window) >= MIN_JUDGED:
            self._judge(state, verdict, extents, duration)
        self._learn(state, verdict, duration)
        return verdict

    def _state(self, key: str) -> _Key:
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _Key()
            while len(self._keys) > MAX_KEYS:
                self._keys.popitem(last=False)
        return state

    def _judge(
        self, state: _Key, verdict: Verdict, extents: Mapping[int, Extent], duration: int
    ) -> None:
        noise = state.noise
        typical, step_threshold = state.step_noise
        verdict.threshold_ns = noise.threshold_ns
        lateness = verdict.by_rank_ns
        rank = min(lateness, key=lambda r: (-lateness[r], r))
        value = min(lateness[rank], duration)
        named = value > noise.threshold_for(rank) and (
            rank in noise.persistent_ns or noise.delayed(duration - typical)
        )
        if named:
            verdict.rank, verdict.lateness_ns = rank, value
            split = self._split(verdict, extents, rank)
            verdict.by_category_ns = {c: v for c, v in split.items() if v > 0}
            verdict.category = max(split, key=lambda c: (split[c], -CATEGORIES.index(c)))
        for r, value in lateness.items():  # a rank against its own usual lateness
            limit = noise.threshold_for(r)
            self._slowdown(verdict, state, r, value > limit, value, limit)
        if any(r is not STEP_TIME and s.held for r, s in state.slow.items()):
            # a slow rank explains the step time: one raised before it is closed here (and one
            # waiting to last long enough dropped)
            raised = state.slow.pop(STEP_TIME, None)
            if raised is not None and raised.since is not None:
                verdict.changes.append(
                    _change(verdict, STEP_TIME, False, raised, raised.since, step_threshold)
                )
            return
        over = duration - typical
        self._slowdown(verdict, state, STEP_TIME, over > step_threshold, over, step_threshold)

    def _split(self, verdict: Verdict, extents: Mapping[int, Extent], rank: int) -> Dict[str, int]:
        """The named rank's lateness by category (each: its time minus the others' median)."""
        starts = {r: e[0] for r, e in extents.items()}
        split = {BEFORE_STEP: max(0, int(starts[rank] - _median_others(starts, rank)))}
        waits = {r: e[2] for r, e in extents.items() if e[2] is not None}
        if len(waits) == len(extents):  # every rank measured its input wait
            split[INPUT] = max(0, int(waits[rank] - _median_others(waits, rank)))
        if verdict.measured == "arrivals":
            split[COMPUTE] = max(0, verdict.by_rank_ns[rank] - sum(split.values()))
        return split

    def _slowdown(
        self,
        verdict: Verdict,
        state: _Key,
        rank: Optional[int],
        late: bool,
        value: int,
        threshold: int,
    ) -> None:
        slow = state.slow.get(rank)
        if slow is None:
            if not late:
                return  # nothing to remember for a rank that was never late
            slow = state.slow[rank] = _Slowdown()
        began, pending = slow.since, slow.pending
        changed = slow.update(verdict.step, late, value, verdict.extent_ns)
        if pending is None and slow.pending is not None:
            # its steps out of the noise as the run starts to wait, not once it has lasted:
            # waiting, they would be learned and raise the threshold it is judged by (a raise
            # always follows a wait: nothing left to take out then)
            _forget(state, rank, slow.pending[0])
        if changed is None:
            return
        since = slow.since if changed else began
        verdict.changes.append(
            _change(verdict, rank, changed, slow, since or verdict.step, threshold, value)
        )
        if not changed:
            del state.slow[rank]

    def _learn(self, state: _Key, verdict: Verdict, duration: int) -> None:
        """The step joins what the noise is learned from, less the ranks in a slowdown or in a
        run of late steps not yet long enough to be one (and its duration while any lasts)."""
        if STEP_TIME in state.slow and state.slow[STEP_TIME].held:
            return
        slowed = {r for r, s in state.slow.items() if s.held}
        step = verdict.step
        state.window.append(
            (step, {r: v for r, v in verdict.by_rank_ns.items() if r not in slowed})
        )
        if not slowed:  # a slow rank stretches the step too: the usual step is learned without
            state.durations.append((step, duration))
        state.since_refresh += 1
        if len(state.window) < WINDOW or state.since_refresh >= REFRESH_EVERY:
            state.since_refresh = 0
            state.noise = noise_of(_settled(state.window, step), self.min_ns)
            state.step_noise = _step_noise(_settled(state.durations, step), self.min_ns)


def _change(
    verdict: Verdict,
    rank: Optional[int],
    began: bool,
    slow: _Slowdown,
    since: int,
    threshold: int,
    value: int = 0,
) -> Change:
    """A slowdown raised (``began``) or ended at this verdict's step; its typical value is the
    median of what the slowdown saw (``value`` where it saw nothing yet)."""
    typical = int(statistics.median(slow.values)) if slow.values else value
    start, end = slow.since_extent if began else verdict.extent_ns
    return Change(verdict.key, rank, began, since, verdict.step, typical, threshold, start, end)


def _settled(entries: Deque[Tuple[int, Any]], step: int) -> List[Any]:
    """What the noise is learned from: the steps at least SLOW_WINDOW before ``step``, whose
    slowdowns would have been raised by now (then taken out by _forget), once there are
    MIN_SETTLED of them; before that, every step (a short job's few early steps alone would
    judge its later ones)."""
    settled = [value for at, value in entries if step - at >= SLOW_WINDOW]
    return settled if len(settled) >= MIN_SETTLED else [value for _, value in entries]


def _forget(state: _Key, rank: Optional[int], since: int) -> None:
    """Take a slowdown's steps from ``since`` on back out of what the noise was learned from:
    the rank's lateness, and the step durations it stretched (all of them for the step time)."""
    for step, lateness in state.window:
        if step >= since and rank is not STEP_TIME:
            lateness.pop(rank, None)
    kept = [(step, d) for step, d in state.durations if step < since]
    if len(kept) >= MIN_JUDGED:  # else keep what there is: a step time needs a usual one
        state.durations = deque(kept, maxlen=WINDOW)
    state.since_refresh = REFRESH_EVERY  # learn again at the next step


def _step_noise(durations: List[int], min_ns: int) -> Tuple[int, int]:
    """The typical step and how far above it a step is beyond the noise (robust sigmas)."""
    typical = statistics.median(durations)
    spread = MAD_TO_SIGMA * statistics.median(abs(d - typical) for d in durations)
    return int(typical), max(min_ns, int(NOISE_SIGMAS * spread))


def verdict_attributes(verdict: Verdict) -> Dict[str, Any]:
    """The step root's attributes of a verdict (none for a step not judged)."""
    if not verdict.judged:
        return {}
    attributes: Dict[str, Any] = {
        record.ATTR_STRAGGLER_THRESHOLD: verdict.threshold_ns,
        record.ATTR_STRAGGLER_MEASURED: verdict.measured,
    }
    if verdict.rank is not None:
        attributes[record.ATTR_STRAGGLER_RANK] = verdict.rank
        attributes[record.ATTR_STRAGGLER_LATENESS] = verdict.lateness_ns
        if verdict.category is not None:
            attributes[record.ATTR_STRAGGLER_CATEGORY] = verdict.category
    return attributes


def slowdown_record(change: Change) -> Tuple[str, Dict[str, Any], str]:
    """A slowdown's span name, attributes and one-line summary."""
    attributes: Dict[str, Any] = {
        record.ATTR_SLOWDOWN_STATE: record.BEGAN if change.began else record.ENDED,
        record.ATTR_SLOWDOWN_SINCE: change.since_step,
        record.ATTR_SLOWDOWN_AT: change.step,
        record.ATTR_SLOWDOWN_LATENESS: change.lateness_ns,
        record.ATTR_SLOWDOWN_THRESHOLD: change.threshold_ns,
    }
    ms = change.lateness_ns / 1e6
    limit = change.threshold_ns / 1e6
    if change.rank is not None:
        attributes[record.ATTR_SLOWDOWN_RANK] = change.rank
        who = f"rank {change.rank} slowdown"
        how = f"rank {change.rank} is late by {ms:.1f} ms a step (noise allows {limit:.1f} ms)"
    else:
        who = "step time slowdown"
        how = f"steps take {ms:.1f} ms longer than usual (noise allows {limit:.1f} ms)"
    if change.began:
        summary = f"{who}: {how} since step {change.since_step} of {change.key}"
    else:
        steps = change.step - change.since_step
        summary = (
            f"{who} ended: at step {change.step} of {change.key}, after {steps} steps "
            f"since step {change.since_step} ({ms:.1f} ms a step while it lasted)"
        )
    name = who if change.began else f"{who} ended"
    return name, attributes, "tf_otel: " + summary
