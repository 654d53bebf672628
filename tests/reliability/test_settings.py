"""One place for settings: only tf_otel/config.py reads TF_OTEL_* from the environment, every
variable it knows is in the README's settings table and nothing else is."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List

from conftest import REPO

from tf_otel.config import SCRIPT_VARIABLES, VARIABLES, Settings

PACKAGE = REPO / "tf_otel"
CONFIG = PACKAGE / "config.py"


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


def test_every_variable_is_parsed_and_in_the_readme():
    readme = (REPO / "README.md").read_text()
    table = set(re.findall(r"^\| `(TF_OTEL_[A-Z0-9_]+)`", readme, re.M))
    table |= set(re.findall(r"^\| `TF_OTEL_[A-Z0-9_]+`, `(TF_OTEL_[A-Z0-9_]+)`", readme, re.M))
    missing, unknown = sorted(set(VARIABLES) - table), sorted(table - set(VARIABLES))
    assert not missing and not unknown, f"README lacks {missing}; README has unknown {unknown}"
    source = CONFIG.read_text()
    for name in VARIABLES:
        assert f'"{name}"' in source.split("VARIABLES = (")[0], f"{name} is not parsed in from_env"


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
