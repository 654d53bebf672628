"""The package's shape: no import cycle inside tf_otel/.

The import graph is built from every module's syntax tree, module-level AND function-level
imports (a deferred import still ties two modules together; it only hides the circle until run
time). An edge goes to the module named, not to its parent packages' ``__init__``; a module's
import of its own ancestor package (``from tf_otel import clock`` in ``tf_otel.clock.sync``) is
not an edge either: Python runs a package's ``__init__`` before any module inside it, so that
dependency is always there and a package's facade importing its own parts is no circle between
rooms. A synthetic package with a known circle checks that the finder finds one.

Run: ``.venv/bin/python -m pytest -p no:cacheprovider tests/test_architecture.py``
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

PACKAGE = Path(__file__).resolve().parent.parent / "tf_otel"


def _modules(root: Path) -> Dict[str, Path]:
    """Dotted module name -> file, for every .py under the package ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: Dict[str, Path]) -> str:
    """The innermost known module of a dotted name (``a.b.func`` -> ``a.b``); '' if outside."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def import_graph(root: Path) -> Dict[str, Set[str]]:
    """Module -> the package's modules it imports anywhere in its body."""
    modules = _modules(root)
    graph: Dict[str, Set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package, up level-1 more
                    anchor = name.split(".")
                    anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import mod` imports pkg.mod when it is a module, else a name of pkg
                targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
                targets = [t if t in modules else base for t in targets]
            for target in targets:
                found = _resolve(target, modules)
                if found and found != name and not name.startswith(found + "."):
                    graph[name].add(found)
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_in_tf_otel():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and "tf_otel.instrument.ops.hook" in graph  # the real package was read
    # function-level imports count
    assert "tf_otel.instrument.ops.admin" in graph["tf_otel.instrument.ops.hook"]
    found = cycles(graph)
    assert not found, "import cycles inside tf_otel/: " + "; ".join(" <-> ".join(c) for c in found)


def test_finder_sees_a_function_level_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("def h():\n    from pkg.sub import b\n")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from pkg import sub\n\n\ndef f():\n    from .. import c\n")
    (pkg / "c.py").write_text("import os\n\n\ndef g():\n    import pkg.a\n")
    (pkg / "d.py").write_text("from pkg import a\nfrom .sub.b import f\n")  # into it, not in it
    graph = import_graph(pkg)
    assert graph["pkg.sub"] == {"pkg.sub.b"}  # a facade of its parts; b -> its package: no edge
    assert graph["pkg.sub.b"] == {"pkg.c"} and graph["pkg.d"] == {"pkg.a", "pkg.sub.b"}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    (pkg / "c.py").write_text("import os\n")  # control: the circle broken
    assert cycles(import_graph(pkg)) == []


def test_version_module_matches_the_project_and_the_runtime_reads_it_there():
    import tomllib

    from tf_otel.version import __version__

    root = Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert __version__ == project["version"]
    for path in (root / "tf_otel").glob("[comr]*/*.py"):  # cluster, metrics, otel, runtime
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "tf_otel":
                names = {alias.name for alias in node.names}
                assert "__version__" not in names, f"{path.name}: import it from tf_otel.version"


def _contract_names() -> Dict[str, str]:
    """record.py's ATTR_* names -> their values: the trace contract's attribute names."""
    import tf_otel.record as record

    return {k: v for k, v in vars(record).items() if k.startswith("ATTR_") and isinstance(v, str)}


def _attr_literals(path: Path) -> List[Tuple[str, str]]:
    """(name, value) of every ``ATTR_... = "literal"`` assignment in a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                name = getattr(target, "id", "")
                if name.lstrip("_").startswith("ATTR_") and isinstance(node.value.value, str):
                    found.append((name, node.value.value))
    return found


def test_the_contract_names_live_in_record_only():
    """Every attribute name the analysis reads is defined in record.py, and no module (runtime
    or analysis) writes a contract name out again; docs/ARCHITECTURE.md names each of them."""
    root = Path(__file__).resolve().parent.parent
    names = _contract_names()
    values = set(names.values())
    assert len(values) == len(names), "two record.py names for one attribute"
    for path in sorted((root / "tf_otel").rglob("*.py")):
        if path.name == "record.py" and path.parent.name == "tf_otel":
            continue
        literals = _attr_literals(path)
        if "analysis" in path.parts:
            assert not literals, f"{path}: the analysis takes contract names from record.py"
        again = [(n, v) for n, v in literals if v in values]
        assert not again, f"{path}: {again} repeat record.py (import them from there)"
    doc = (root / "docs" / "ARCHITECTURE.md").read_text()
    missing = sorted(v for v in values if f"`{v}`" not in doc)
    assert not missing, f"docs/ARCHITECTURE.md does not name {missing}"


def test_categories_are_one_enum_and_its_values_as_plain_str():
    """record.Category defines every tf_otel.category value once; record's module constants are
    its values as exact str (what records, attributes and the analysis' rows hold), and the
    architecture doc's category table names each."""
    import tf_otel.record as record

    for member in record.Category:
        constant = getattr(record, member.name)
        assert type(constant) is str and constant == member.value, member
        assert str(member) == f"{member}" == member.value  # as text, the value
    doc = (Path(__file__).resolve().parent.parent / "docs" / "ARCHITECTURE.md").read_text()
    table = doc.split("### Categories (`tf_otel.category`)", 1)[1].split("\n### ", 1)[0]
    missing = [c.value for c in record.Category if f"| `{c.value}` |" not in table]
    assert not missing, f"docs/ARCHITECTURE.md's category table lacks {missing}"


def test_the_contract_check_finds_a_repeated_name(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('ATTR_W = "horovod.wait_ns"\n_ATTR_X = "x.y"\nOTHER = "horovod.wait_ns"\n')
    assert _attr_literals(module) == [("ATTR_W", "horovod.wait_ns"), ("_ATTR_X", "x.y")]
    assert "horovod.wait_ns" in _contract_names().values()


# start-up code that may read the environment: the instrumentor (once, handed on), the settings
# module itself, and the command-line tools / probes that run as processes of their own
READS_ENV_AT_START = {
    "config.py",
    "instrument/__init__.py",
    "clock/clock_check_cli.py",
    "clock/pair.py",
    "clock/__init__.py",  # TF_OTEL_TEST_CLOCK, resolved once per process (test only)
}


def _reads_env(path: Path) -> List[int]:
    """Lines calling ``Settings.from_env()`` with no mapping (the process environment)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "from_env"
            and not node.args
            and not node.keywords
        ):
            lines.append(node.lineno)
    return lines


def test_settings_are_read_once_at_start_up():
    """Everything after start-up takes the settings instrument() read, from register(settings)
    or config.current(); nothing reads the environment again."""
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        found = _reads_env(path)
        if found and relative not in READS_ENV_AT_START:
            offenders[relative] = found
    assert not offenders, f"Settings.from_env() outside start-up: {offenders}"
    # every module the instrumentor registers takes the settings it read
    registered = sorted((PACKAGE / "instrument").glob("*.py")) + [
        PACKAGE / "instrument" / "horovod" / "__init__.py",
        PACKAGE / "instrument" / "ops" / "hook.py",
    ]
    for path in registered:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name == "register":
                names = [a.arg for a in node.args.args]
                assert names == ["settings"], f"{path}: register{tuple(names)}"


def test_the_env_read_check_finds_a_call(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("x = Settings.from_env()\ny = Settings.from_env({'A': '1'})\n")
    assert _reads_env(module) == [1]


HOOK_METHODS = ("on_step_start", "on_step_end")


def _untyped_handles(path: Path) -> List[str]:
    """Functions of ``path`` that take a step ``handle`` typed ``Any`` (or not typed at all),
    and step-hook methods whose first argument is not a ``StepHandle``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = [a for a in node.args.args if a.arg not in ("self", "cls")]
        for argument in arguments:
            if argument.arg != "handle":
                continue
            typed = ast.unparse(argument.annotation) if argument.annotation else ""
            if typed in ("", "Any", "Optional[Any]"):
                found.append(f"{node.name}:{node.lineno}")
        if node.name in HOOK_METHODS and arguments:
            typed = ast.unparse(arguments[0].annotation) if arguments[0].annotation else ""
            if typed != "StepHandle":
                found.append(f"{node.name}:{node.lineno} ({arguments[0].arg}: {typed or '?'})")
    return found


def test_step_hooks_take_a_typed_step_handle():
    """The hook contract is typed (instrument/_patching.StepHook): the type checker sees what a
    hook reads from the step, and hooks share state through StepHandle's named fields."""
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found = _untyped_handles(path)
        if found:
            offenders[path.relative_to(PACKAGE).as_posix()] = found
    assert not offenders, f"step handles typed Any: {offenders}"
    assert "flags" not in _step_handle_fields(), "StepHandle.flags: share through named fields"


def _step_handle_fields() -> List[str]:
    tree = ast.parse((PACKAGE / "step_handle.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "StepHandle":
            return [
                n.target.id
                for n in node.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            ]
    raise AssertionError("no StepHandle in tf_otel/step_handle.py")


def test_the_handle_check_finds_an_untyped_hook(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "class H:\n"
        "    def on_step_start(self, handle: Any, call): ...\n"
        "    def on_step_end(self, step: StepHandle, call, error, kept): ...\n"
        "def f(handle): ...\n"
        "def g(handle: StepHandle): ...\n"
    )
    assert sorted(_untyped_handles(module)) == [
        "f:4",
        "on_step_start:2",
        "on_step_start:2 (handle: Any)",
    ]


# the runtime's rooms, bottom to top: a room imports only rooms below it (and tf_otel's base
# modules, clock/, job/, sources/); each room's __init__ says what it owns in a few lines
LAYERS = ("tf_otel.otel", "tf_otel.metrics", "tf_otel.cluster", "tf_otel.runtime")
MAX_MODULES_IN_A_ROOM = 20


def _layer(module: str) -> int:
    return next((i for i, room in enumerate(LAYERS) if module.startswith(room + ".")), -1)


def test_the_runtime_rooms_import_only_down():
    graph = import_graph(PACKAGE)
    assert all(any(m.startswith(room + ".") for m in graph) for room in LAYERS)
    up = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if _layer(module) >= 0 and _layer(target) > _layer(module)
    )
    assert not up, "imports back up a layer: " + "; ".join(up)


def test_the_layer_check_sees_an_import_up(tmp_path):
    pkg = tmp_path / "tf_otel"
    for room in ("otel", "runtime"):
        (pkg / room).mkdir(parents=True)
        (pkg / room / "__init__.py").write_text('"""A room."""\n')
    (pkg / "__init__.py").write_text("")
    (pkg / "runtime" / "steps.py").write_text("from tf_otel.otel import sdk\n")
    (pkg / "otel" / "sdk.py").write_text("def f():\n    from tf_otel.runtime import steps\n")
    graph = import_graph(pkg)
    up = [(m, t) for m, ts in graph.items() for t in ts if _layer(t) > _layer(m) >= 0]
    assert up == [("tf_otel.otel.sdk", "tf_otel.runtime.steps")]


def test_each_runtime_room_says_what_it_owns_and_stays_small():
    for room in LAYERS:
        folder = PACKAGE / room.split(".", 1)[1]
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        assert 0 < len(doc.splitlines()) <= 6 and "import" in doc.lower(), room
        assert len(list(folder.glob("*.py"))) - 1 <= MAX_MODULES_IN_A_ROOM, room
