"""Ground truth for the resource-detail steps (instrument/step_detail.py,
TF_OTEL_RESOURCES_EVERY=1), with controls that must find nothing:

- a step that allocates and frees 256 MiB shows a peak RSS at least that far above its end RSS;
  the steps that allocate nothing show no such gap; no GPU here: no GPU attribute, no error;
- files of known sizes read through a tf.data pipeline (a Python reader): the per-file bytes of
  the steps add up to each file's size within 5 %; the same pipeline reading nothing lists no file;
- TFRecordDataset's C++ reader uses pread: its files are named as open but unmoved, no bytes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import base_env, python, run  # noqa: E402

pytestmark = pytest.mark.integration

JOB = str(Path(__file__).resolve().parent / "detail_job.py")
MIB = 2**20


def _run(receiver, tmp_path, **extra):
    env = base_env(
        **receiver.env("grpc"), TF_OTEL_ENABLED="1", TF_OTEL_RESOURCES_EVERY="1",
        DATA_DIR=str(tmp_path), **extra,
    )  # fmt: skip
    result = run([python(), JOB], env, timeout=300)
    steps = int(re.search(r"done steps=(\d+)", result.stdout).group(1))

    def steps_of(spans):
        return sorted(
            (s for s in spans if s.category == "step"), key=lambda s: s.attributes["tf_otel.step"]
        )

    spans = receiver.wait_for(lambda s: len(steps_of(s)) >= steps, 30)
    found = steps_of(spans)
    assert [s.attributes["tf_otel.step"] for s in found] == list(range(steps))
    return result, found


def test_peak_rss_shows_a_freed_allocation_and_no_gpu_means_nothing(receiver, tmp_path):
    result, steps = _run(receiver, tmp_path, MODE="alloc", STEPS="8", ALLOC_MB="256")
    for step in steps:
        attributes = step.attributes
        gap = attributes["tf_otel.memory.peak_rss"] - attributes["process.memory.usage"]
        if attributes["tf_otel.step"] % 2 == 1:
            assert gap >= 0.95 * 256 * MIB, (attributes["tf_otel.step"], gap / MIB)
        else:
            assert gap < 32 * MIB, (attributes["tf_otel.step"], gap / MIB)
        assert "tf_otel.gpu.memory.peak" not in attributes
        assert list(attributes["tf_otel.detail"]) == ["resources"]  # every step (EVERY=1)
    assert "step_detail" not in result.stderr, result.stderr[-2000:]


def test_per_file_read_bytes_match_the_files(receiver, tmp_path):
    result, steps = _run(receiver, tmp_path, MODE="files")
    sizes = {path: int(size) for path, size in re.findall(r"file (\S+) (\d+)", result.stdout)}
    assert len(sizes) == 3
    read: dict = {}
    for step in steps:
        attributes = step.attributes
        paths = list(attributes.get("tf_otel.io.files", ()))
        assert len(paths) <= 16
        assert attributes["tf_otel.io.files.total"] == len(paths)
        for path, nbytes, mode in zip(
            paths, attributes["tf_otel.io.files.bytes"], attributes["tf_otel.io.files.mode"]
        ):
            assert mode == "r", (path, mode)
            if path not in sizes:  # step 0 traces the function: autograph reads its source
                assert attributes["tf_otel.step"] == 0, (path, attributes["tf_otel.step"])
                continue
            read[path] = read.get(path, 0) + nbytes
    assert set(read) == set(sizes), (read, sizes)
    for path, size in sizes.items():
        assert read[path] == pytest.approx(size, rel=0.05), (path, read[path], size)


def test_control_reading_nothing_lists_no_file(receiver, tmp_path):
    _, steps = _run(receiver, tmp_path, MODE="files", NO_READ="1")
    for step in steps:
        attributes = step.attributes
        paths = list(attributes.get("tf_otel.io.files", ()))
        assert not any(p.startswith(str(tmp_path)) for p in paths), paths
        if attributes["tf_otel.step"] > 0:  # step 0: autograph may read the job's source
            assert attributes["tf_otel.io.files.total"] == 0, paths


def test_tfrecord_reader_files_are_named_unmoved(receiver, tmp_path):
    _, steps = _run(receiver, tmp_path, MODE="tfrecord", STEPS="8", BATCH="32")
    unmoved = set()
    for step in steps:
        attributes = step.attributes
        assert not any(p.endswith(".tfrecord") for p in attributes.get("tf_otel.io.files", ()))
        unmoved.update(attributes.get("tf_otel.io.files.unmoved", ()))
    assert any(p.startswith(str(tmp_path)) and p.endswith(".tfrecord") for p in unmoved), unmoved
