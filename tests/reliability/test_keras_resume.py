"""A Keras ``fit`` resumed by ``BackupAndRestore`` (issue 44, point 4): a tiny model, 6 epochs of
4 batches backed up at each epoch's end; the first process is interrupted at the start of epoch
3 (a callback raises, as Keras' own tests interrupt a fit) and exits; a second process runs the
same ``fit`` and resumes from the backup. Its step numbers continue where the restored state
says (12 = 3 epochs x 4 batches, the optimizer's restored ``iterations``), and its job span and
first step say where it resumed (``tf_otel.resumed.epoch`` 3, ``tf_otel.resumed.step`` 12).
Keras 3 and tf_keras alike. Control: the second run without the callback restores nothing and
numbers from 0 with no resume attribute."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from conftest import REPO, base_env, python

pytestmark = pytest.mark.integration

SCRIPT = str(REPO / "tests" / "reliability" / "scripts" / "keras_resume.py")
RESUMED = ("tf_otel.resumed.epoch", "tf_otel.resumed.step")


def _run(tmp_path: Path, name: str, legacy: bool, **extra: str) -> Tuple[List, Dict]:
    """Run the fit once: (its train steps as (step, resume attributes), the job span's)."""
    spans = tmp_path / f"{name}.jsonl"
    env = base_env(
        TF_OTEL_ENABLED="1",
        TF_OTEL_FILE=str(spans),
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        BACKUP_DIR=str(tmp_path / "backup"),
        **extra,
    )
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    done = subprocess.run(
        [python(), SCRIPT], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    interrupted = "INTERRUPT_EPOCH" in extra
    assert done.returncode == (3 if interrupted else 0), done.stderr[-3000:]
    steps, job = [], {}
    for line in spans.read_text().splitlines():
        for resource in json.loads(line)["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    attributes: Dict[str, Any] = {
                        a["key"]: next(iter(a["value"].values())) for a in span["attributes"]
                    }
                    said = {k: int(v) for k, v in attributes.items() if k in RESUMED}
                    if attributes["tf_otel.category"] == "step":
                        assert attributes["tf_otel.step.kind"] == "keras_train"
                        steps.append((int(attributes["tf_otel.step"]), said))
                    elif attributes["tf_otel.category"] == "job":
                        job = said
    return sorted(steps), job


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_a_resumed_fit_numbers_on_and_says_where_it_resumed(tmp_path: Path, legacy: bool) -> None:
    first, first_job = _run(tmp_path, "first", legacy, INTERRUPT_EPOCH="3")
    assert [step for step, _ in first] == list(range(12))  # epochs 0-2, interrupted at 3
    assert not any(said for _, said in first) and first_job == {}
    assert (tmp_path / "backup").is_dir()
    resumed, job = _run(tmp_path, "resumed", legacy)
    assert [step for step, _ in resumed] == list(range(12, 24)), resumed
    where = {"tf_otel.resumed.epoch": 3, "tf_otel.resumed.step": 12}
    assert job == where
    assert resumed[0][1] == where and not any(said for _, said in resumed[1:]), resumed
    # control: the same fit without BackupAndRestore restores nothing and numbers from 0
    control, control_job = _run(tmp_path, "control", legacy, RESTORE="0")
    assert [step for step, _ in control] == list(range(24))
    assert not any(said for _, said in control) and control_job == {}
