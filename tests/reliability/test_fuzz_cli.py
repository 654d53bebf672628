"""Every ``tf-otel`` option is validated: any value ends in a normal exit status or argparse's one
clear error (status 2) — never a traceback. In-process, on a small real trace file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tf_otel.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "analysis"))
from analysis_builders import JobBuilder  # noqa: E402

VALUES = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["-1", "0", "1", "nan", "inf", "-inf", "1e309", "3:1", ":", "2h", "1:2:3"]),
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
)
ANALYZE_OPTIONS = [
    "--limit",
    "--job",
    "--steps",
    "--since",
    "--until",
    "--straggler-min-share",
    "--straggler-min-ms",
    "--max-steps",
    "--max-pictures",
    "--format",
    "--service",
]
CLOCK_OPTIONS = ["--rounds", "--exchanges", "--interval", "--timeout", "--transport"]


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory) -> Path:
    job = JobBuilder(world_size=2)
    for n in range(4):
        step = job.step(n)
        step.rank(0, 0.0, 10.0)
        step.rank(1, 0.0, 12.0)
    path = tmp_path_factory.mktemp("cli") / "spans.jsonl"
    job.write_otlp(path)
    return path


@settings(
    max_examples=150,
    deadline=5000,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.tuples(st.sampled_from(ANALYZE_OPTIONS), VALUES), max_size=3))
def test_analyze_options_never_raise(trace_file: Path, capsys, options):
    argv = ["analyze", str(trace_file), "--format", "json"]
    for name, value in options:
        argv += [f"{name}={value}"]
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse: one line naming the option and the value
        assert exit_.code == 2, argv
        err = capsys.readouterr().err
        assert "error: argument" in err or "error: unrecognized" in err, err
        return
    assert status in (0, 1, 2), argv
    capsys.readouterr()


@settings(max_examples=80, deadline=2000, derandomize=True)
@given(st.tuples(st.sampled_from(CLOCK_OPTIONS), VALUES))
def test_clock_check_options_are_validated_before_anything_runs(option):
    name, value = option
    from tf_otel.cli import build_parser

    parser = build_parser()
    try:
        parser.parse_args(["clock-check", f"{name}={value}"])
    except SystemExit as exit_:
        assert exit_.code == 2


def test_a_bad_value_names_the_option_and_the_value(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["analyze", "x", "--limit", "-3"])
    assert exit_.value.code == 2
    assert "argument --limit: expected an integer > 0, got '-3'" in capsys.readouterr().err
