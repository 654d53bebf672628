"""What tf_otel promises users' tools: the instrumentor names no distribution it depends on, so
OpenTelemetry's dependency check lets it instrument whatever distribution provides the
``tensorflow`` module; the package is marked typed (PEP 561) and packaging ships the marker
(the built wheel's contents: tests/test_foundation_unit.py).

Run: ``.venv/bin/python -m pytest -p no:cacheprovider -q tests/test_public_surface.py``
"""

from __future__ import annotations

from pathlib import Path

import tomllib
from opentelemetry.instrumentation import dependencies
from opentelemetry.util._importlib_metadata import PackageNotFoundError

from tf_otel.instrument import TensorFlowInstrumentor

REPO = Path(__file__).resolve().parent.parent


def test_no_tensorflow_distribution_name_is_required(monkeypatch):
    def version(name: str) -> str:  # as under tensorflow-cpu or tf-nightly: no "tensorflow"
        raise PackageNotFoundError(name)

    monkeypatch.setattr(dependencies, "version", version)
    instrumentor = TensorFlowInstrumentor()
    assert tuple(instrumentor.instrumentation_dependencies()) == ()
    assert instrumentor._check_dependency_conflicts() is None  # instrument() goes ahead
    # control: naming the usual distribution would make instrument() refuse there
    conflict = dependencies.get_dependency_conflicts(["tensorflow >= 2.15"])
    assert conflict is not None and conflict.required == "tensorflow >= 2.15"


def test_the_package_is_marked_typed_and_ships_the_marker():
    assert (REPO / "tf_otel" / "py.typed").is_file()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["tf_otel"]


def test_tf_otel_instrument_stays_callable_after_its_package_is_imported():
    """``tf_otel.instrument`` is both the function and the package ``tf_otel/instrument/``:
    importing anything in the package rebinds the name to it. A second ``tf_otel.instrument()``
    (idempotent, as its docstring says) and one after ``import tf_otel.instrument.keras`` still
    instrument, in a process that never imports TensorFlow."""
    import subprocess
    import sys

    code = (
        "import sys, tf_otel\n"
        "tf_otel.instrument(configure_sdk=False)\n"
        "import tf_otel.instrument.keras\n"
        "tf_otel.instrument(configure_sdk=False)\n"
        "from tf_otel.instrument import TensorFlowInstrumentor\n"
        "print(TensorFlowInstrumentor().is_instrumented_by_opentelemetry,"
        " 'tensorflow' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False"], done.stdout
