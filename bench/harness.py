"""What the bench harnesses share: launching a job, running modes in interleaved rounds, and the
paired-ratio summary.

A bench compares modes side by side in one run (the machines are noisy, so never against a number
from another day): every round runs each mode once, in an order rotated from round to round, so
no mode always runs first or always after the same one; a mode is then judged by its per-round
ratios to a baseline mode (the same round, the same load), their median and quartiles.

    import harness

    # one job: this shell's OTEL_* / TF_OTEL_* dropped, the mode's own settings added
    env = harness.job_env(STEPS="100", TF_OTEL_ENABLED="1")
    job = harness.launch([sys.executable, "examples/custom_loop.py"], env, timeout=600)
    job.wall_s, job.peak_rss_mb, job.stderr, job.after("fit_seconds=")

    # a Horovod job whose ranks each print harness.emit_result({"rank": ..., ...})
    env = harness.horovod_env(tmp)  # spans written to tmp/spans-{rank}.jsonl
    job = harness.launch(harness.horovodrun(2, [__file__, "--worker"]), env, timeout=900)
    results = harness.rank_results(job, 2)  # or exit with the job's output

    # a job of several processes started together (MultiWorkerMirroredStrategy's workers)
    ports, coordinator = harness.free_ports(2), harness.free_port_pair()
    jobs = harness.launch_group([(command, env_0), (command, env_1)], timeout=600)

    # modes in rotated order each round: {mode: [what run returned, a round each]}
    times = harness.interleaved(["off", "on"], rounds, lambda round_no, mode: block(mode))
    ratio, q1, q3 = harness.median_quartiles(harness.paired_ratios(times["on"], times["off"]))

    # in a worker: {mode: [ns of each step]}, `block` steps a mode and round
    times = harness.step_times(MODES, rounds, block, switch_to_mode, train_step)

A bench run as a script (``python bench/bench_x.py``, and its ``--worker`` processes) has bench/
first on sys.path, so ``import harness`` finds this file. Standard library only at import:
a worker imports it before tf_otel.instrument().
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

K = TypeVar("K")  # a mode: its name, or whatever the bench switches on
R = TypeVar("R")  # what one run of a mode measured

RESULT = "RESULT "  # a worker's result line: RESULT {json}
# the benches' result pages (docs/BENCHMARKS.md is their index, one line a page)
RESULTS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"

# -- launching a job ----------------------------------------------------------------------------


def job_env(**extra: str) -> Dict[str, str]:
    """This process's environment without its OTEL_* / TF_OTEL_* settings (each mode sets its
    own: a stray one in the shell would change every mode), TensorFlow's C++ log quiet, `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TF_OTEL_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", **extra)
    return env


def horovod_env(tmp: str, **extra: str) -> Dict[str, str]:
    """job_env for horovodrun: this venv's horovodrun first on PATH, mpirun allowed as root, the
    spans really built and written (OTLP-JSON, tmp/spans-{rank}.jsonl) but not sent, temporary
    files under tmp; then `extra`."""
    env = job_env()
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OTEL_TRACES_EXPORTER="none",
        TF_OTEL_FILE=os.path.join(tmp, "spans-{rank}.jsonl"),
        TMPDIR=tmp,
        **extra,
    )
    return env


def horovodrun(ranks: int, argv: Sequence[str], backend: str = "gloo") -> List[str]:
    """The command of `ranks` ranks of ``python argv...`` on this machine under this venv's
    horovodrun."""
    venv = Path(sys.executable).parent
    command = [str(venv / "horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}"]
    return command + [f"--{backend}", sys.executable, *argv]


@dataclass
class Job:
    """One finished job: its exit status, output, wall time and the child's peak RSS."""

    command: List[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_rss_mb: float

    def after(self, marker: str) -> List[str]:
        """The text after `marker` on each stdout line that holds it (anywhere in the line:
        horovodrun puts a rank prefix before each)."""
        return [line.split(marker, 1)[1] for line in self.stdout.splitlines() if marker in line]

    def results(self) -> List[Dict[str, Any]]:
        """The workers' emit_result dicts, in the order they were printed."""
        return [json.loads(text) for text in self.after(RESULT)]


def launch(
    command: Sequence[str],
    env: Optional[Dict[str, str]] = None,
    timeout: Optional[float] = None,
    check: bool = False,
) -> Job:
    """Run `command` to its end (env None: this process's environment). Past `timeout` seconds
    the child is killed and subprocess.TimeoutExpired raised, as subprocess.run does; check:
    CalledProcessError on a non-zero exit.

    Output goes to temporary files, not pipes, and the child is reaped with wait4: its own peak
    RSS comes back, and a grandchild that keeps the output open cannot hold the bench."""
    command = [str(part) for part in command]
    expired = threading.Event()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=err)

        def expire() -> None:
            expired.set()
            proc.kill()  # a no-op once reaped: Popen polls before it signals

        timer = threading.Timer(timeout, expire) if timeout is not None else None
        try:
            if timer is not None:
                timer.start()
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:  # interrupted: the child must not outlive the bench
            proc.kill()
            proc.wait()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    if expired.is_set():
        raise subprocess.TimeoutExpired(command, timeout or 0.0, stdout, stderr)
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, command, stdout, stderr)
    return Job(command, proc.returncode, stdout, stderr, wall, usage.ru_maxrss / 1024)


def launch_group(
    members: Sequence[Tuple[Sequence[str], Optional[Dict[str, str]]]], timeout: float
) -> List[Job]:
    """Run every (command, env) at once, to their ends: a Job each, in order. One that fails
    ends the rest (its peers would wait for it until the timeout); past `timeout` seconds all
    are killed and subprocess.TimeoutExpired raised. Output and peak RSS as launch's."""
    commands = [[str(part) for part in command] for command, _ in members]
    procs: List[subprocess.Popen] = []
    ends: Dict[int, Tuple[int, float, float]] = {}  # index -> (exit code, wall s, peak MB)
    expired = False

    def reap(index: int, flags: int) -> None:
        pid, status, usage = os.wait4(procs[index].pid, flags)
        if pid:
            procs[index].returncode = os.waitstatus_to_exitcode(status)  # reaped here
            wall = time.perf_counter() - started
            ends[index] = (procs[index].returncode, wall, usage.ru_maxrss / 1024)

    with contextlib.ExitStack() as stack:
        files = [
            (
                stack.enter_context(tempfile.TemporaryFile()),
                stack.enter_context(tempfile.TemporaryFile()),
            )
            for _ in members
        ]
        started = time.perf_counter()
        try:
            for command, (_, env), (out, err) in zip(commands, members, files):
                procs.append(subprocess.Popen(command, env=env, stdout=out, stderr=err))
            # polled, not wait4(-1): only these children are reaped
            while len(ends) < len(procs):
                for index in range(len(procs)):
                    if index not in ends:
                        reap(index, os.WNOHANG)
                expired = len(ends) < len(procs) and time.perf_counter() - started > timeout
                if expired or any(code != 0 for code, _, _ in ends.values()):
                    break
                time.sleep(0.1)
        finally:  # failed, expired or interrupted: no member outlives the group
            for index, proc in enumerate(procs):
                if index not in ends:
                    proc.kill()
                    reap(index, 0)
        outputs = []
        for out, err in files:
            out.seek(0)
            err.seek(0)
            outputs.append(
                (out.read().decode(errors="replace"), err.read().decode(errors="replace"))
            )
    if expired:
        text = "\n".join(stdout + stderr for stdout, stderr in outputs)
        raise subprocess.TimeoutExpired(commands[0], timeout, text)
    jobs = []
    for index, (command, (stdout, stderr)) in enumerate(zip(commands, outputs)):
        code, wall, peak_mb = ends[index]
        jobs.append(Job(command, code, stdout, stderr, wall, peak_mb))
    return jobs


def free_ports(n: int = 1) -> List[int]:
    """n distinct free ports for servers given their number up front (TF_CONFIG's tasks):
    tests/ports.py's, outside the kernel's ephemeral range, from a block of this process's own."""
    return _ports().free_ports(n)


def free_port_pair() -> int:
    """A port p with p + 1 free as well (TF_OTEL_COORDINATOR: rank 0's clock service takes
    p + 1): tests/ports.py's."""
    return _ports().free_port_pair()


def _ports() -> Any:
    """tests/ports.py as the module `ports` (the one bench_steps imports: one walk over the
    ports per process), loaded on first use: a worker never needs it."""
    if "ports" not in sys.modules:
        path = Path(__file__).resolve().parent.parent / "tests" / "ports.py"
        spec = importlib.util.spec_from_file_location("ports", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["ports"] = module
        spec.loader.exec_module(module)
    return sys.modules["ports"]


def thread_cpu() -> Dict[str, float]:
    """CPU seconds so far of this process's live threads, summed by thread name (from /proc:
    where a service's CPU goes, e.g. rank 0's coordinator loop against its clock service)."""
    ticks = os.sysconf("SC_CLK_TCK")
    spent: Dict[str, float] = {}
    for thread in threading.enumerate():
        try:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, ...
        cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
        spent[thread.name] = spent.get(thread.name, 0.0) + cpu
    return spent


def generated_markers(name: str) -> Tuple[str, str]:
    """The two lines around ``name``'s generated section of a markdown file (write_generated)."""
    return (
        f"<!-- {name}: generated from here (the bench rewrites this section) -->",
        f"<!-- {name}: generated up to here -->",
    )


def read_generated(path: Path, name: str) -> str:
    """The text of ``name``'s generated section of the file at ``path`` ('' if there is none):
    what a bench that adds to its last run's section (``--append``) starts from."""
    begin, end = generated_markers(name)
    old = path.read_text() if path.exists() else ""
    _, found, rest = old.partition(begin)
    if not found or end not in rest:
        return ""
    return rest.split(end, 1)[0].strip()


def write_generated(path: Path, name: str, text: str, title: str) -> None:
    """Write ``text`` into the generated section of the markdown file at ``path``, between the
    two ``name`` markers, and nothing else: the hand-written rest of the file stays. A file
    without the markers gets the section at its end; a missing one, ``title`` and the section."""
    begin, end = generated_markers(name)
    section = f"{begin}\n{text.strip()}\n{end}"
    old = path.read_text() if path.exists() else f"# {title}\n"
    head, found, rest = old.partition(begin)
    if found and end in rest:
        new = head + section + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(new)


def emit_result(result: Dict[str, Any]) -> None:
    """A worker's result line, for Job.results in the bench that launched it."""
    print(RESULT + json.dumps(result), flush=True)


def rank_results(job: Job, ranks: int) -> List[Dict[str, Any]]:
    """Every rank's result, or exit with the tail of the job's output: with a rank missing the
    bench has nothing to compare."""
    results = job.results()
    if len(results) != ranks:
        sys.exit(f"bench failed ({job.returncode}):\n{job.stdout[-3000:]}\n{job.stderr[-3000:]}")
    return results


def written_spans(directory: Path, pattern: str = "spans-*.jsonl") -> Iterator[Dict[str, Any]]:
    """Each span of the OTLP-JSON files (TF_OTEL_FILE) matching `pattern` in `directory`; a line
    a killed rank left half-written is passed over."""
    for path in directory.glob(pattern):
        with open(path) as f:
            for line in f:
                try:
                    data = json.loads(line)
                except ValueError:
                    continue
                for rs in data.get("resourceSpans", []):
                    for ss in rs.get("scopeSpans", []):
                        yield from ss.get("spans", [])


# -- interleaved rounds -------------------------------------------------------------------------


def round_order(
    modes: Sequence[K], round_no: int, *, rotate: bool = True, reverse_odd: bool = False
) -> List[K]:
    """The modes in the order round `round_no` runs them: rotated by the round number (each
    mode runs first once in len(modes) rounds); reverse_odd: odd rounds backwards as well (so
    the backlog a mode leaves falls on another next mode; without rotate, the whole rule)."""
    shift = round_no % len(modes) if rotate else 0
    order = list(modes[shift:]) + list(modes[:shift])
    return order[::-1] if reverse_odd and round_no % 2 else order


def each_round(
    modes: Sequence[K],
    rounds: int,
    run: Callable[[int, K], R],
    *,
    rotate: bool = True,
    reverse_odd: bool = False,
) -> Iterator[Tuple[int, Dict[K, R]]]:
    """(round number, {mode: run(round number, mode)} in the order they ran) for each round."""
    for round_no in range(rounds):
        order = round_order(modes, round_no, rotate=rotate, reverse_odd=reverse_odd)
        yield round_no, {mode: run(round_no, mode) for mode in order}


def interleaved(
    modes: Sequence[K], rounds: int, run: Callable[[int, K], R], **order: bool
) -> Dict[K, List[R]]:
    """{mode: [run(round number, mode) of each round]}, keyed in the order of `modes`; order:
    round_order's rotate / reverse_odd."""
    results: Dict[K, List[R]] = {mode: [] for mode in modes}
    for _, got in each_round(modes, rounds, run, **order):
        for mode, value in got.items():
            results[mode].append(value)
    return results


def step_times(
    modes: Sequence[K],
    rounds: int,
    block: int,
    switch: Callable[[K], None],
    step: Callable[[], Any],
    **order: bool,
) -> Dict[K, List[int]]:
    """{mode: [ns of each step]}, in one process: each round, every mode in turn is switched on
    and `block` steps of it are timed one by one (what a --worker of a Horovod job reports)."""

    def one_block(_round_no: int, mode: K) -> List[int]:
        switch(mode)
        times: List[int] = []
        for _ in range(block):
            t0 = time.perf_counter_ns()
            step()
            times.append(time.perf_counter_ns() - t0)
        return times

    blocks = interleaved(modes, rounds, one_block, **order)
    return {mode: [ns for times in runs for ns in times] for mode, runs in blocks.items()}


# -- summary ------------------------------------------------------------------------------------


def paired_ratios(values: Sequence[float], base: Sequence[float]) -> List[float]:
    """Each round's value over the same round's baseline (same load, minutes apart at most)."""
    return [v / b for v, b in zip(values, base)]


def median_quartiles(values: Sequence[float]) -> Tuple[float, float, float]:
    """(median, q1, q3); one value is all three (statistics.quantiles wants two)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4)
    return statistics.median(values), q1, q3


def per_rank_rows(results: List[Dict[str, Any]], modes: Sequence[str], base: str) -> List[str]:
    """Markdown rows ``| rank | mode | median | p90 | median vs base |`` (ms) of the step times
    (ns) that workers report as {"rank": r, "times": {mode: [ns, ...]}}."""
    rows = []
    for result in sorted(results, key=lambda r: r["rank"]):
        baseline = statistics.median(result["times"][base])
        for mode in modes:
            values = sorted(result["times"][mode])
            median = statistics.median(values)
            p90 = values[int(len(values) * 0.9)]
            rows.append(
                f"| {result['rank']} | {mode} | {median / 1e6:.3f} | {p90 / 1e6:.3f} | "
                f"{median / baseline:.3f} |"
            )
    return rows


# -- a worker's model ---------------------------------------------------------------------------


def dense_allreduce_step(layers: int, data_seed: int) -> Any:
    """A tf.function training step of `layers` dense 256x256 ReLU layers under Horovod's
    DistributedGradientTape (an allreduce a layer, fused by Horovod) on a fixed 32-row batch
    seeded (9, data_seed); after hvd.init()."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    width = 256
    variables = [
        tf.Variable(tf.random.stateless_normal([width, width], seed=(i, 1)) * 0.05)
        for i in range(layers)
    ]
    x = tf.random.stateless_normal([32, width], seed=(9, data_seed))

    @tf.function
    def train_step() -> Any:
        with tf.GradientTape() as tape:
            h = x
            for v in variables:
                h = tf.nn.relu(tf.matmul(h, v))
            loss = tf.reduce_mean(h)
        grads = hvd.DistributedGradientTape(tape).gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(0.01 * g)
        return loss

    return train_step
