"""`tf-otel analyze --scheduler`: the analysis on a running Dask cluster gives the same report.

A real `dask scheduler` and two `dask worker` processes on 127.0.0.1 (the commands a SLURM job
or dask-jobqueue would start), the CLI pointed at the scheduler, the spill in a directory both
workers see. The control: the same command in one process. And a scheduler nobody runs is one
line naming the address, exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from test_analysis_cli import analyze

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ports import refused_port  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden"
DASK = Path(sys.executable).with_name("dask")


def _start(args: List[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([str(DASK), *args], stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[str]:
    # port 0 for the scheduler and its dashboard, the address read back from its scheduler file:
    # no port picked here that another process could take before the scheduler binds it
    info = tmp_path / "scheduler.json"
    started = [
        _start(
            [
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--dashboard-address",
                "127.0.0.1:0",
                "--scheduler-file",
                str(info),
            ],
            tmp_path / "scheduler.log",
        )
    ]
    try:
        address = _scheduler_address(started[0], info, tmp_path / "scheduler.log")
        for number in range(2):
            started.append(
                _start(
                    [
                        "worker",
                        address,
                        "--host",
                        "127.0.0.1",
                        "--nthreads",
                        "1",
                        "--no-dashboard",
                        "--local-directory",
                        str(tmp_path / f"w{number}"),
                    ],
                    tmp_path / f"worker{number}.log",
                )
            )
        _wait_for_workers(address, 2)
        yield address
    finally:
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def _scheduler_address(process: subprocess.Popen, info: Path, log: Path) -> str:
    """The address the scheduler listens on, from the file it writes once it does."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return json.loads(info.read_text())["address"]
        except (OSError, ValueError, KeyError):
            pass  # not written yet, or half written
        assert process.poll() is None, f"the dask scheduler ended:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "the dask scheduler never wrote its address"
        time.sleep(0.2)


def _wait_for_workers(address: str, count: int) -> None:
    from dask.distributed import Client

    with Client(address, timeout="60s") as client:
        deadline = time.monotonic() + 60
        while len(client.scheduler_info()["workers"]) < count:
            assert time.monotonic() < deadline, "the dask workers never joined the scheduler"
            time.sleep(0.2)


def test_analysis_on_a_dask_cluster_equals_the_one_process_analysis(
    scheduler: str, tmp_path: Path
) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()
    here = analyze(str(GOLDEN / "demo"), "--format", "json", "--with-path")
    assert here.returncode == 0, here.stderr
    there = analyze(
        str(GOLDEN / "demo"),
        "--format",
        "json",
        "--with-path",
        "--scheduler",
        scheduler,
        "--spill-dir",
        str(spill),
    )
    assert there.returncode == 0, there.stderr
    assert there.stdout == here.stdout
    assert '"straggler"' in there.stdout
    assert not list(spill.iterdir())  # the spill is removed when the analysis ends


def test_an_unreachable_scheduler_is_one_line_naming_it(tmp_path: Path) -> None:
    with refused_port() as port:  # nothing listens there, nor can while the CLI runs
        address = f"tcp://127.0.0.1:{port}"
        done = analyze(str(GOLDEN / "demo"), "--scheduler", address)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and address in lines[0], done.stderr
    assert "Traceback" not in done.stderr
