"""What a step did not measure, said for the right reason (issue 43, point 4): a one-process
MirroredStrategy job's steps without collective spans did not measure communication (its
replicas do all-reduce), and a loop fed by in-memory tensors has no tf.data input to measure
("no tf.data input seen", not a setting to turn on). Controls: one device, and tf.data batches.

    .venv/bin/pytest -q tests/distribute/test_measured_sources.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
from conftest import REPO, VENV_BIN, base_env, python, run
from otlp_files import file_spans

from tf_otel import record

pytestmark = pytest.mark.integration

SCRIPT = REPO / "tests" / "distribute" / "scripts" / "no_tf_data_train.py"


def _job(out: Path, **extra: str) -> Dict[str, Any]:
    env = base_env(
        TF_OTEL_ENABLED="1",
        TF_OTEL_FILE=str(out / "spans-{rank}.jsonl"),
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        TF_OTEL_HOROVOD_EVERY="1000",  # no collective detail on these steps
        **extra,
    )
    assert "done" in run([python(), str(SCRIPT)], env, timeout=240).stdout
    report = run([str(VENV_BIN / "tf-otel"), "analyze", str(out), "--format", "json"], base_env())
    return json.loads(report.stdout)


def _step_spans(out: Path) -> List[Dict[str, Any]]:
    return [
        s["attributes"]
        for s in file_spans(out)
        if s["attributes"].get(record.ATTR_CATEGORY) == record.STEP
    ]


def test_mirrored_replicas_without_collective_spans_did_not_measure_communication(tmp_path):
    report = _job(tmp_path, REPLICAS="2")
    spans = _step_spans(tmp_path)
    assert spans and all(a[record.ATTR_STEP_REPLICAS] == 2 for a in spans), spans
    assert all(a[record.ATTR_INPUT_SEEN] is False for a in spans), spans
    categories = report["summary"]["categories"]
    # a step with collective detail may measure it; the others say they did not
    assert categories["communication"]["status"] != "measured", categories
    assert "no tf.data input seen" in json.dumps(categories["input"]), categories
    plain = [s for s in report["steps"] if "communication" in s["not_measured"]]
    assert len(plain) >= len(report["steps"]) - 2, report["steps"]
    for step in report["steps"]:
        assert step["not_measured"]["input"] == "no tf.data input seen", step


def test_controls_one_device_and_tf_data(tmp_path):
    one = _job(tmp_path / "one", REPLICAS="1")
    spans = _step_spans(tmp_path / "one")
    assert spans and not any(record.ATTR_STEP_REPLICAS in a for a in spans), spans
    # one process, one device: nothing to communicate, measured as 0
    assert one["summary"]["critical_path_share"]["communication"] == 0.0, one["summary"]
    fed = _job(tmp_path / "fed", REPLICAS="1", DATASET="1")
    spans = _step_spans(tmp_path / "fed")
    assert spans and not any(record.ATTR_INPUT_SEEN in a for a in spans), spans
    assert "no tf.data input seen" not in json.dumps(fed), fed["summary"]["categories"]
