"""The detail twin's pacing to the CPU the training leaves idle (instrument/cpu_pacer.py, issue
45): the share follows the idle cores, ranks pacing themselves leave the training its cores,
a real thread is held to its share, a machine kept busy by real processes reads no idle core,
and C++ work runs on a nice-19 thread of its own."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Callable, List, Optional

import pytest

from tf_otel.instrument import cpu_pacer
from tf_otel.instrument.cpu_pacer import CEILING, FALLBACK, FLOOR, Pacer, SpareCpu, next_share


class Idle(SpareCpu):
    """Idle cores as a test sets them (the reading itself is tested below)."""

    def __init__(self, cores: Optional[float]) -> None:
        self.value = cores

    def prime(self) -> bool:
        return self.value is not None

    def cores(self) -> Optional[float]:
        return self.value


def test_a_busy_machine_brings_the_share_down_to_the_floor_and_an_idle_one_up_to_the_ceiling():
    share = CEILING
    for _ in range(6):  # what it used was its share; nothing sat idle
        share = next_share(share, 0.0)
    assert share == FLOOR
    for _ in range(10):
        share = next_share(share, 8.0)
    assert share == CEILING
    assert next_share(0.3, None) == FALLBACK, "idle cores unknown: the fixed share"
    # the control: idle cores at the headroom never raise the share
    assert next_share(0.1, cpu_pacer.HEADROOM) < 0.1


@pytest.mark.parametrize("ranks,idle", [(2, 0.0), (2, 0.2), (2, 1.0), (4, 1.5), (8, 6.0)])
def test_ranks_pacing_themselves_leave_the_training_its_cores(ranks, idle):
    """``idle`` cores sit idle without tf_otel; each rank's twin takes its share of them, the
    others see what is left. None knows the others, yet together they never take more than the
    idle cores less the headroom (plus one look's raise each), take a fair part of them on
    average, and each still prepares (at least the floor)."""
    shares = [FLOOR] * ranks
    taken: List[float] = []
    for _ in range(200):
        left = max(0.0, idle - sum(shares))
        shares = [next_share(share, left) for share in shares]
        taken.append(sum(shares))
    settled = taken[100:]
    assert all(share >= FLOOR for share in shares)
    if idle - ranks * FLOOR <= cpu_pacer.HEADROOM:
        assert shares == [FLOOR] * ranks, "a busy machine: the floor"
        return
    assert max(settled) <= max(idle - cpu_pacer.HEADROOM, 0) + ranks * cpu_pacer.RAISE + 1e-9
    fair = min(idle - cpu_pacer.HEADROOM, ranks * CEILING) / 2
    assert sum(settled) / len(settled) >= fair, (sum(settled) / len(settled), fair)


def test_the_pacer_sleeps_what_its_share_owes(monkeypatch):
    slept: List[float] = []
    monkeypatch.setattr(cpu_pacer.time, "sleep", slept.append)
    pacer = Pacer(Idle(0.0))
    start_wall, start_cpu = pacer.last
    assert pacer.share == FLOOR
    # 0.1 s of wall, 0.1 s of CPU: 0.1 - FLOOR * 0.1 ahead, slept off at the floor's rate
    assert pacer.look(start_wall + 0.1, start_cpu + 0.1) == pytest.approx(
        min((0.1 - FLOOR * 0.1) / FLOOR, cpu_pacer.MAX_SLEEP_S)
    )
    fresh = Pacer(Idle(0.0))
    wall, cpu = fresh.last
    assert fresh.look(wall + 2.0, cpu) == 0.0, "behind its share: no sleep"
    assert fresh.ahead == pytest.approx(cpu_pacer.BURST_S), "an idle spell banks little"
    assert Pacer(Idle(None)).share == FALLBACK


def _some_python() -> int:
    return sum(abs(i) for i in range(200))  # Python calls: the profile function's events


def _spin(pacer: Optional[Pacer], seconds: float, out: List[float]) -> None:
    if pacer is not None:
        sys.setprofile(pacer)
    wall0, cpu0 = time.monotonic(), time.thread_time()
    try:
        while time.monotonic() - wall0 < seconds:
            _some_python()
    finally:
        sys.setprofile(None)
    out.append((time.thread_time() - cpu0) / (time.monotonic() - wall0))


def test_a_real_thread_is_held_to_its_share_and_an_exit_abandons_its_work():
    paced: List[float] = []
    thread = threading.Thread(target=_spin, args=(Pacer(Idle(0.0)), 3.0, paced))
    thread.start()
    thread.join()
    # the floor (1/64 of a core) and the burst it may bank: well under a tenth of a core
    assert paced[0] < 0.08, paced
    stop = threading.Event()
    stopping = Pacer(Idle(0.0), stop=stop.is_set)
    forked = stopping.fork()
    assert forked.share == stopping.share and forked.stop is stopping.stop
    stop.set()
    started = time.monotonic()
    with pytest.raises(cpu_pacer.Abandoned):  # into the paced code at its next look
        _spin(stopping, 5.0, [])
    assert time.monotonic() - started < 1.0 and stopping.slept == 0.0
    # the thread it started is no longer paced, and never raised into: it finishes its work
    finished: List[float] = []
    started = time.monotonic()
    _spin(forked, 0.5, finished)
    assert finished and forked.stopped and forked.slept == 0.0


class _Pushes:
    """TensorFlow's tf_stack pattern: __enter__ pushes itself and then calls update(), __exit__
    pops and asserts it popped itself."""

    stack: List[object] = []

    def __enter__(self) -> _Pushes:
        self.stack.append(self)
        self.update()
        return self

    def update(self) -> None:
        _plain()

    def __exit__(self, *exc: object) -> None:
        top = self.stack.pop()
        assert top is self, "Concurrent access?"


def _plain() -> int:
    return 1


def _pushing_work() -> None:
    for _ in range(10_000):
        with _Pushes():
            with _Pushes():
                _plain()


def _abandon_after(events: int, work: Callable[[], None] = _pushing_work) -> BaseException:
    """Run ``work`` under a pacer told to stop at its look after ``events`` events."""
    _Pushes.stack[:] = ["bottom"]
    pacer = Pacer(Idle(0.0), stop=lambda: True)
    pacer.events = cpu_pacer._EVERY - events  # its first look (stop) comes after ``events``
    sys.setprofile(pacer)
    try:
        work()
    except BaseException as exc:  # noqa: BLE001 - what came out is the point
        return exc
    finally:
        sys.setprofile(None)
    raise AssertionError("the work was never abandoned")


@pytest.mark.parametrize("rule", ["safe calls", "any call"])
def test_abandoned_work_is_left_at_a_plain_call_never_inside_a_context_manager(
    rule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Abandoned is raised as a plain function starts, never in a context manager's __enter__ /
    __exit__: raised from the update() that tf_stack's __enter__ calls after pushing, the next
    __exit__ pops the wrong entry ('Concurrent access?'). The control raises at any call: the
    same positions then break the stack, so the check can fail."""
    if rule == "any call":
        # the pacer's own signature: a TypeError raised in its place would not be re-armed
        # where it lands in a finalizer (a weakref callback the collector runs), and the work
        # would go on unabandoned
        monkeypatch.setattr(cpu_pacer, "may_raise_here", lambda frame, within=None: True)
    outcomes = set()
    for events in range(1, 40):  # every phase of the loop's body
        exc = _abandon_after(events)
        outcomes.add((type(exc).__name__, len(_Pushes.stack)))
    if rule == "safe calls":
        assert outcomes == {("Abandoned", 1)}, outcomes
    else:
        assert any(name == "AssertionError" for name, _ in outcomes), outcomes


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_machine_kept_busy_reads_no_idle_core():
    """Real processes fill every core; the host's own counters must show it."""
    cores = multiprocessing.cpu_count()
    burners = [multiprocessing.Process(target=_burn, args=(4.0,)) for _ in range(cores)]
    for burner in burners:
        burner.start()
    try:
        time.sleep(0.5)
        spare = SpareCpu()
        assert spare.prime()
        time.sleep(2.0)
        idle = spare.cores()
    finally:
        for burner in burners:
            burner.join()
    assert idle is not None and idle < 0.5, idle


def test_a_cgroup_cpu_limit_caps_the_idle_cores(tmp_path: Path):
    """cgroup v2's documented files: ``cpu.max`` "$MAX $PERIOD", ``cpu.stat`` "usage_usec N"."""
    host = iter([0.0, 60.0])  # host idle seconds: 60 idle cores over the 1 s below
    (tmp_path / "cpu.max").write_text("200000 100000\n")  # 2 cores
    (tmp_path / "cpu.stat").write_text("usage_usec 5000000\nuser_usec 4000000\n")
    spare = SpareCpu(tmp_path, host=lambda: next(host))
    assert spare.limit == 2.0
    assert spare.prime()
    (tmp_path / "cpu.stat").write_text("usage_usec 6500000\nuser_usec 5000000\n")  # 1.5 s used
    spare.last = (spare.last[0] - 1.0, *spare.last[1:])  # the reading before was 1 s ago
    assert spare.cores() == pytest.approx(0.5, abs=0.05), "2 cores allowed, 1.5 used"
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert SpareCpu(tmp_path).limit is None, "no limit: the host's idle cores"
    assert SpareCpu(tmp_path / "absent").limit is None


def test_unreadable_counters_read_as_unknown():
    def broken() -> float:
        raise OSError("no /proc here")

    spare = SpareCpu(Path("/nonexistent"), host=broken)
    assert not spare.prime()
    assert spare.cores() is None
    assert Pacer(spare).share == FALLBACK


def test_low_priority_work_runs_niced_on_its_own_thread_and_the_caller_keeps_its_priority():
    import os

    runner = cpu_pacer.LowPriority("test-low-priority")
    me = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, me)

    def where():
        tid = threading.get_native_id()
        return tid, os.getpriority(os.PRIO_PROCESS, tid)

    tid, nice = runner.run(where)
    assert tid != me and nice == cpu_pacer.LowPriority.NICE and runner.niced
    assert os.getpriority(os.PRIO_PROCESS, me) == before, "the caller's priority is untouched"
    assert runner.run(where)[0] == tid, "one thread, reused"

    def fails():
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        runner.run(fails)
    assert runner.run(lambda: 7) == 7, "an error does not end the thread"


class _Held:
    pass


def _dropped() -> None:
    _plain()  # the finalizer's own Python: where the pacer may raise first


def _finalizing_work() -> None:
    """Each iteration drops an object with a finalizer (called on the dropped reference, where
    an exception can only be reported as unraisable) between plain calls."""
    for _ in range(10_000):
        held = _Held()
        weakref.finalize(held, _dropped)
        del held
        _plain()


def test_abandoned_swallowed_by_a_finalizer_is_raised_again_at_the_next_call(
    capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Raised into a finalizer, Abandoned is swallowed as unraisable and Python drops the
    thread's profile function: the pacer is put back and raises again, silently, so the work
    still ends. Control: without the hook the work runs on to its end unpaced."""
    positions = range(200, 300)  # every phase of the loop's steady iterations
    outcomes = {type(_abandon_after(events, _finalizing_work)).__name__ for events in positions}
    assert outcomes == {"Abandoned"}, outcomes
    assert "Exception ignored" not in capfd.readouterr().err
    monkeypatch.setattr(cpu_pacer, "_rearm_when_swallowed", lambda pacer: None)
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    with pytest.raises(AssertionError, match="never abandoned"):
        for events in positions:
            _abandon_after(events, _finalizing_work)
    assert "Exception ignored" in capfd.readouterr().err


def test_the_floor_is_the_setting_and_a_busy_machine_holds_the_share_there(monkeypatch):
    from tf_otel.config import Settings
    from tf_otel.instrument import detail_twin

    monkeypatch.setattr(cpu_pacer, "FLOOR", FLOOR)  # put back after the test
    settings = Settings.from_env({"TF_OTEL_TWIN_CPU_FLOOR": "0.125"})
    detail_twin.prepare_where(settings.twin_prepare, settings.twin_cpu_floor)
    assert cpu_pacer.FLOOR == 0.125
    assert Pacer(Idle(0.0)).share == 0.125
    assert next_share(0.5, 0.0) == 0.25 and next_share(0.2, 0.0) == 0.125  # halves to the floor
    assert Settings.from_env({}).twin_cpu_floor == FLOOR == 1 / 64
    for bad in ("0", "0.6", "-1", "a"):  # one message naming the value, the default kept
        assert Settings.from_env({"TF_OTEL_TWIN_CPU_FLOOR": bad}).twin_cpu_floor == FLOOR
    cpu_pacer.set_floor(2.0)
    assert cpu_pacer.FLOOR == CEILING
