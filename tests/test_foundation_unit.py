"""Fast checks of the foundation without TensorFlow: settings, topology, ids, packaging."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from tf_otel import config
from tf_otel.job import topology
from tf_otel.otel.ids import step_root_span_id, step_trace_id


def test_import_does_not_import_tensorflow() -> None:
    code = "import tf_otel, tf_otel.instrument, sys; assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_entry_point_is_registered() -> None:
    found = [
        ep for ep in entry_points(group="opentelemetry_instrumentor") if ep.name == "tensorflow"
    ]
    assert len(found) == 1
    from tf_otel.instrument import TensorFlowInstrumentor

    assert found[0].load() is TensorFlowInstrumentor


def test_bad_env_values_are_named_once_and_defaults_used(caplog: pytest.LogCaptureFixture) -> None:
    env = {"TF_OTEL_OPS_EVERY": "ten", "TF_OTEL_COORDINATOR": "nohost", "TF_OTEL_ENABLED": "maybe"}
    with caplog.at_level(logging.WARNING, logger="tf_otel"):
        settings = config.Settings.from_env(env)
        config.Settings.from_env(env)
    assert settings.ops_every == 0 and settings.coordinator is None and settings.enabled is False
    messages = [r.getMessage() for r in caplog.records]
    assert any("TF_OTEL_OPS_EVERY='ten'" in m for m in messages)
    assert any("TF_OTEL_COORDINATOR='nohost'" in m for m in messages)
    assert sum("TF_OTEL_OPS_EVERY" in m for m in messages) == 1


def test_good_env_values() -> None:
    settings = config.Settings.from_env(
        {"TF_OTEL_ENABLED": "1", "TF_OTEL_OPS_EVERY": "10", "TF_OTEL_COORDINATOR": "h:1234"}
    )
    assert settings.enabled and settings.ops_every == 10 and settings.coordinator == ("h", 1234)


@pytest.mark.parametrize(
    "env, expected",
    [
        (
            {
                "HOROVOD_RANK": "1",
                "HOROVOD_SIZE": "4",
                "HOROVOD_LOCAL_RANK": "1",
                "HOROVOD_LOCAL_SIZE": "2",
                "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1",
                "HOROVOD_GLOO_RENDEZVOUS_PORT": "5555",
            },
            ("horovod", 1, 4, 1, 2),
        ),
        (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                "OMPI_MCA_ess_base_jobid": "123",
            },
            ("openmpi", 3, 4, 1, 2),
        ),
        (
            {
                "PMI_RANK": "2",
                "PMI_SIZE": "3",
                "MPI_LOCALRANKID": "2",
                "MPI_LOCALNRANKS": "3",
                "PMI_KVSNAME": "kvs_1",
            },
            ("pmi", 2, 3, 2, 3),
        ),
        (
            {
                "SLURM_PROCID": "5",
                "SLURM_NTASKS": "8",
                "SLURM_LOCALID": "1",
                "SLURM_NTASKS_PER_NODE": "4",
                "SLURM_JOB_ID": "77",
                "SLURM_STEP_ID": "0",
                "SLURM_STEP_NODELIST": "gpu[07-08]",
            },
            ("slurm", 5, 8, 1, 4),
        ),
    ],
)
def test_topology_from_launchers(env: dict, expected: tuple) -> None:
    topo = topology.detect(env)
    assert (topo.launcher, topo.rank, topo.world_size, topo.local_rank, topo.local_size) == expected
    # every rank of the launch derives the same job id alone
    other = dict(env)
    for key in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        if key in other:
            other[key] = "0"
    assert topology.detect(other).job_id == topo.job_id
    assert (
        topo.job_id
        != topology.detect(
            {
                **env,
                "SLURM_JOB_ID": "78",
                "PMI_KVSNAME": "x",
                "OMPI_MCA_ess_base_jobid": "9",
                "HOROVOD_GLOO_RENDEZVOUS_PORT": "1",
            }
        ).job_id
    )


def test_slurm_reference_host_and_nodelist() -> None:
    assert topology.expand_slurm_nodelist("gpu[07-09,12],login1") == [
        "gpu07",
        "gpu08",
        "gpu09",
        "gpu12",
        "login1",
    ]
    topo = topology.detect(
        {
            "SLURM_PROCID": "0",
            "SLURM_NTASKS": "8",
            "SLURM_LOCALID": "0",
            "SLURM_NTASKS_PER_NODE": "4",
            "SLURM_JOB_ID": "1",
            "SLURM_STEP_ID": "0",
            "SLURM_STEP_NODELIST": "gpu[07-08]",
        }
    )
    assert topo.reference_host == "gpu07"


def test_tf_config_topology() -> None:
    cluster = {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"]}
    ranks = [
        topology.detect({"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})})
        for task in (
            {"type": "worker", "index": 0},
            {"type": "worker", "index": 1},
            {"type": "ps", "index": 0},
        )
    ]
    assert [t.rank for t in ranks] == [0, 1, 2]
    assert {t.world_size for t in ranks} == {3}
    assert len({t.job_id for t in ranks}) == 1
    assert ranks[2].task == "ps:0"
    assert {t.step_world_size for t in ranks} == {2}, "parameter servers run no steps"


def test_bad_tf_config_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tf_otel"):
        topo = topology.detect({"TF_CONFIG": "{not json"})
    assert topo.world_size == 1
    assert any("TF_CONFIG" in r.getMessage() for r in caplog.records)


def test_job_id_override() -> None:
    assert topology.detect({}, job_id="my-job").job_id == "my-job"


def test_step_ids_are_deterministic_and_distinct() -> None:
    a = step_trace_id("job", "keras_train", 3)
    assert a == step_trace_id("job", "keras_train", 3)
    assert a != step_trace_id("job", "keras_train", 4)
    assert a != step_trace_id("job2", "keras_train", 3)
    assert a != step_trace_id("job", "keras_evaluate", 3)
    assert 0 < a < 2**128 and 0 < step_root_span_id("job", "k", 3) < 2**64


def test_wheel_ships_the_startup_hook(tmp_path) -> None:
    """TF_OTEL_ENABLED=1 works after `pip install tf-otel`: the .pth is in the wheel root."""
    import zipfile
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(repo),
        ],
        check=True,
        cwd=tmp_path,
    )
    wheel = next(tmp_path.glob("tf_otel-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "tf_otel-autostart.pth" in names
    assert "tf_otel/instrument/__init__.py" in names
    assert "tf_otel/py.typed" in names  # PEP 561: users' type checkers read our annotations
    plugin = "tf_otel/nccl/plugin/"
    for source in ("tf_otel_nccl_profiler.c", "nccl_profiler_abi.h", "tf_otel_nccl_ring.h"):
        assert plugin + source in names, source  # `tf-otel nccl-plugin` builds from these
    assert plugin + "build.sh" in names
    # ... and does, from the wheel's files alone (unpacked, as pip installs a pure wheel)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    out = tmp_path / "built" / "libnccl-profiler-tf_otel.so"
    env = dict(os.environ, PYTHONPATH=str(site))
    code = (
        "import sys, tf_otel; print(tf_otel.__file__, flush=True); "
        "from tf_otel.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, "nccl-plugin", "--out", str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0 and out.exists(), run.stdout + run.stderr
    assert run.stdout.startswith(str(site / "tf_otel")), run.stdout  # the wheel's copy ran
    entry_points_txt = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points_txt).decode()
    assert "[opentelemetry_instrumentor]" in text
    assert "tensorflow = tf_otel.instrument:TensorFlowInstrumentor" in text
