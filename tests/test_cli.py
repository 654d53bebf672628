"""``tf-otel``'s command table (tf_otel/cli.py): every command's module imports and adds the
command it is listed under; a module that fails to import leaves a command that names the module
and the error when run or listed, instead of vanishing.

Run: ``.venv/bin/python -m pytest -p no:cacheprovider -q tests/test_cli.py``
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tf_otel import cli


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_listed_command_imports_and_adds_itself(command, capsys):
    with pytest.raises(SystemExit) as exit_:  # a real subparser's --help exits 0
        cli.main([command, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: tf-otel {command}")


@pytest.mark.parametrize(
    "source, error",
    [
        ("import tf_otel_no_such_module\n", "ModuleNotFoundError: No module named"),
        ("from os import no_such_name\n", "ImportError: cannot import name 'no_such_name'"),
    ],
)
def test_a_command_whose_module_fails_to_import_says_so(
    source, error, tmp_path: Path, monkeypatch, capsys
):
    (tmp_path / "broken_command.py").write_text(source + "def add_parser(subparsers): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "broken", "broken_command")

    # its own options and arguments reach this message, not argparse's "unrecognized"
    assert cli.main(["broken", "--format", "json", "x"]) == cli.BROKEN_EXIT
    err = capsys.readouterr().err
    assert err.startswith("tf-otel broken: unavailable: cannot import broken_command (")
    assert error in err

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    listing = " ".join(capsys.readouterr().out.split())  # argparse wraps the help column
    assert "broken unavailable: cannot import broken_command" in listing
    assert "analyze cross-rank critical path" in listing  # the others stay as they were

    with pytest.raises(SystemExit) as exit_:
        cli.main(["analyze", "--help"])
    assert exit_.value.code == 0
