"""One place for settings: only tf_otel/config.py reads TF_OTEL_* from the environment, each
setting is declared once there, and the README's table and ``tf-otel settings`` are made from it."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Dict, List

from conftest import REPO

from tf_otel import cli
from tf_otel.config import SCRIPT_VARIABLES, SPECS, VARIABLES, Settings

PACKAGE = REPO / "tf_otel"
CONFIG = PACKAGE / "config.py"
SCRIPT = REPO / "scripts" / "settings_table.py"


def _tf_otel_constants() -> Dict[str, str]:
    """NAME -> value for every module-level constant in the package bound to a TF_OTEL_ string."""
    names: Dict[str, str] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and node.value.value.startswith("TF_OTEL_")
            ):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        names[target.id] = node.value.value
    return names


def _is_environ(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return text.endswith("environ") or text in ("env", "os.getenv")


def _reads(path: Path, constants: Dict[str, str]) -> List[str]:
    """Lines that read os.environ / env / os.getenv with a TF_OTEL_ name (literal or constant)."""

    def tf_otel_name(arg: ast.AST) -> bool:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value.startswith("TF_OTEL_")
        name = arg.attr if isinstance(arg, ast.Attribute) else getattr(arg, "id", None)
        return name in constants

    tree = ast.parse(path.read_text())
    readers = {  # this module's functions that read the environment themselves
        f.name
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef)
        and any(isinstance(n, ast.Attribute) and n.attr == "environ" for n in ast.walk(f))
    }
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            key = node.slice
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault"):
                if _is_environ(func.value):
                    key = node.args[0]
            elif ast.unparse(func) == "os.getenv":
                key = node.args[0]
        if key is not None and tf_otel_name(key):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
        elif (  # an environment-reading helper handed a variable's name
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in readers
            and any(isinstance(a, ast.Constant) and a.value in VARIABLES for a in node.args)
        ):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_config_reads_tf_otel_variables():
    constants = _tf_otel_constants()
    offenders = [
        line for path in PACKAGE.rglob("*.py") if path != CONFIG for line in _reads(path, constants)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_checker_catches_a_stray_read(tmp_path: Path):
    """The check above could fail: a module reading a TF_OTEL_ variable is flagged."""
    module = REPO / "tf_otel" / "_probe_for_test.py"
    module.write_text(
        'import os\nNAME = "TF_OTEL_X"\nA = os.environ.get(NAME)\nB = os.environ["TF_OTEL_Y"]\n'
    )
    try:
        assert len(_reads(module, {"NAME": "TF_OTEL_X"})) == 2
    finally:
        module.unlink()


def _table_script():
    spec = importlib.util.spec_from_file_location("settings_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_table_is_made_from_the_settings():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    script = _table_script()
    assert script.with_table(readme) == readme, "README.md is out of step: make settings-table"
    # the check could fail: a hand-edited row is put back
    edited = readme.replace("steps buffered for export", "steps queued", 1)
    assert edited != readme and script.with_table(edited) == readme
    table = set(re.findall(r"^\| `(TF_OTEL_[A-Z0-9_]+)`", readme, re.M))
    table |= set(re.findall(r"^\| `TF_OTEL_[A-Z0-9_]+`, `(TF_OTEL_[A-Z0-9_]+)`", readme, re.M))
    assert table == set(VARIABLES)


def test_every_field_is_one_declared_setting():
    assert [spec.name for spec in SPECS] == [f.name for f in fields(Settings)]
    assert len(set(VARIABLES)) == len(VARIABLES) and "TF_OTEL_VERDICTS" in VARIABLES
    for spec in SPECS:
        assert spec.doc and "\n" not in spec.doc and spec.shown, spec.name
        assert getattr(Settings(), spec.name) == spec.default


SAMPLES = ("1", "0", "17", "0.25", "h:1", "a, b", "timeline", "step", str(REPO))


def test_each_variable_reaches_its_field():
    """A value other than the default, under any of a setting's names, reaches its field."""
    for spec in SPECS:
        for name in spec.variables:
            for raw in SAMPLES:
                try:
                    expected = spec.parse(raw)
                except ValueError:
                    continue
                if expected != spec.default:
                    break
            else:
                raise AssertionError(f"no sample value for {name}")
            assert getattr(Settings.from_env({name: raw}), spec.name) == expected, name


def test_tf_otel_settings_says_where_each_value_came_from(monkeypatch, capsys):
    for name in [name for name in os.environ if name.startswith("TF_OTEL_")]:
        monkeypatch.delenv(name)
    given = {
        "TF_OTEL_OPS_EVERY": "10",
        "TF_OTEL_MAX_QUEUE": "ten",
        "TF_OTEL_COLLECTIVE_EVERY": "3",
        "TF_OTEL_JOB_SECRET": "s3cret",
        "TF_OTEL_OPS_EVRY": "1",
    }
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["settings", "--format", "json"]) == 0
    out = capsys.readouterr().out
    document = json.loads(out)
    found = {entry["variable"]: entry for entry in document["settings"]}
    assert len(found) == len(SPECS)
    assert found["TF_OTEL_OPS_EVERY"] == {
        "variable": "TF_OTEL_OPS_EVERY",
        "value": 10,
        "source": "environment",
    }
    assert found["TF_OTEL_MAX_QUEUE"]["value"] == 4096
    assert found["TF_OTEL_MAX_QUEUE"]["source"] == "default"
    assert found["TF_OTEL_MAX_QUEUE"]["ignored"] == [
        "TF_OTEL_MAX_QUEUE='ten' (expected an integer)"
    ]
    assert found["TF_OTEL_HOROVOD_EVERY"]["from"] == "TF_OTEL_COLLECTIVE_EVERY"
    assert found["TF_OTEL_JOB_SECRET"]["value"] == "<hidden>" and "s3cret" not in out
    assert found["TF_OTEL_ENABLED"] == {
        "variable": "TF_OTEL_ENABLED",
        "value": False,
        "source": "default",
    }
    assert document["unknown"] == [{"variable": "TF_OTEL_OPS_EVRY", "closest": "TF_OTEL_OPS_EVERY"}]
    assert cli.main(["settings"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.search(r"^TF_OTEL_OPS_EVERY +10 +environment$", "\n".join(lines), re.M)
    assert any(line.startswith("TF_OTEL_OPS_EVRY ") and "did you mean" in line for line in lines)


def test_unknown_variable_is_named_with_a_suggestion(caplog):
    Settings.from_env({"TF_OTEL_OPS_EVRY": "3", "TF_OTEL_CACHE": "/x"})
    text = caplog.text
    assert (
        "unknown setting TF_OTEL_OPS_EVRY='3' is ignored; did you mean TF_OTEL_OPS_EVERY?" in text
    )
    assert "TF_OTEL_CACHE" not in text and not set(SCRIPT_VARIABLES) & set(VARIABLES)


def test_each_bad_value_is_one_clear_line(caplog):
    settings = Settings.from_env(
        {
            "TF_OTEL_ANALYZE_WORKERS": "abc",
            "TF_OTEL_HOROVOD": "maybe",
            "TF_OTEL_ADMIN_PORT": "99999",
        }
    )
    assert (
        settings.analyze_workers == 0 and settings.horovod is True and settings.admin_port is None
    )
    assert "TF_OTEL_ANALYZE_WORKERS='abc' (expected an integer)" in caplog.text
    assert "TF_OTEL_HOROVOD='maybe' (expected one of" in caplog.text
    assert "TF_OTEL_ADMIN_PORT='99999' (expected a port" in caplog.text


def test_the_neutral_collective_every_wins_over_horovods():
    assert Settings.from_env({}).horovod_every == 20
    assert Settings.from_env({"TF_OTEL_HOROVOD_EVERY": "5"}).horovod_every == 5
    assert Settings.from_env({"TF_OTEL_COLLECTIVE_EVERY": "3"}).horovod_every == 3
    both = {"TF_OTEL_HOROVOD_EVERY": "5", "TF_OTEL_COLLECTIVE_EVERY": "1"}
    assert Settings.from_env(both).horovod_every == 1


# where settings cannot be handed over by argument (each says why in a comment)
READS_CURRENT = {"config.py", "runtime/lifecycle.py", "analysis/load/files.py"}


def _current_reads(path: Path) -> List[int]:
    """Lines of ``path`` calling ``config.current()`` (or ``current`` imported from config)."""
    tree = ast.parse(path.read_text())
    imported = any(
        isinstance(node, ast.ImportFrom)
        and node.module == "tf_otel.config"
        and any(alias.name == "current" for alias in node.names)
        for node in ast.walk(tree)
    )
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            ast.unparse(node.func) == "config.current"
            or (imported and ast.unparse(node.func) == "current")
        )
    ]


def test_settings_reach_modules_by_argument(tmp_path: Path):
    found = {
        path.relative_to(PACKAGE).as_posix(): _current_reads(path) for path in PACKAGE.rglob("*.py")
    }
    offenders = {name: lines for name, lines in found.items() if lines}
    assert set(offenders) <= READS_CURRENT, offenders
    probe = tmp_path / "probe.py"  # the check could fail
    probe.write_text("from tf_otel.config import current\nx = current().ops_every\n")
    assert _current_reads(probe) == [2]
