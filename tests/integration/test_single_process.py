"""Zero-code step tracing of real TensorFlow training scripts, exported over real OTLP."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO, VENV_BIN, base_env, example, python, run
from ports import refused_port

pytestmark = pytest.mark.integration

INSTRUMENT = str(VENV_BIN / "opentelemetry-instrument")


def _steps(spans, kind=None):
    return [
        s
        for s in spans
        if s.category == "step" and (kind is None or s.attributes["tf_otel.step.kind"] == kind)
    ]


def _step_numbers(spans, kind, key=None):
    return sorted(
        s.attributes["tf_otel.step"]
        for s in _steps(spans, kind)
        if key is None or key in s.name or key in str(s.attributes)
    )


def _assert_step_traces(spans):
    """Every step span sits under its trace's single root, inside its time range."""
    roots = {s.trace_id: s for s in spans if s.category == "step.root"}
    for step in _steps(spans):
        root = roots[step.trace_id]
        assert step.parent_id == root.span_id
        assert root.start_ns <= step.start_ns <= step.end_ns <= root.end_ns
    per_trace = Counter(s.trace_id for s in spans if s.category == "step.root")
    assert set(per_trace.values()) == {1}


@pytest.mark.parametrize(
    "script, extra, kind, expected",
    [
        ("tf1_session.py", {}, "session_run", list(range(12))),
        ("tf1_session.py", {"MONITORED": "1"}, "session_run", list(range(12))),
        ("keras_fit.py", {"EVALUATE": "0"}, "keras_train", list(range(12))),
        (
            "keras_fit.py",
            {"EVALUATE": "0", "TF_USE_LEGACY_KERAS": "1"},
            "keras_train",
            list(range(12)),
        ),
        (
            "keras_fit.py",
            {"EVALUATE": "0", "STEPS_PER_EXECUTION": "4"},
            "keras_train",
            list(range(3)),
        ),
        ("custom_loop.py", {}, "tf_function", list(range(12))),
    ],
    ids=["tf1", "tf1-monitored", "keras3", "tf_keras", "keras3-spe4", "custom-loop"],
)
def test_opentelemetry_instrument_traces_each_step(receiver, script, extra, kind, expected):
    env = base_env(**receiver.env("grpc"), STEPS="12", OTEL_SERVICE_NAME="t", **extra)
    result = run([INSTRUMENT, python(), example(script)], env)
    assert "done steps=12" in result.stdout
    spans = receiver.wait_for(lambda s: len(_steps(s, kind)) >= len(expected), 20)
    steps = _steps(spans, kind)  # TF1: init and MonitoredSession start-up runs are not steps
    assert sorted(s.attributes["tf_otel.step"] for s in steps) == expected
    assert {s.attributes["tf_otel.rank"] for s in steps} == {0}
    if "STEPS_PER_EXECUTION" in extra:
        assert {s.attributes["tf_otel.step.batches"] for s in steps} == {4}
    assert steps[0].resource["service.name"] == "t"
    assert steps[0].resource["tf_otel.world_size"] == 1
    _assert_step_traces(receiver.spans())


def test_keras_evaluate_and_predict_get_their_own_names(receiver):
    env = base_env(**receiver.env("http"), STEPS="6", TF_OTEL_ENABLED="1")
    run([python(), example("keras_fit.py")], env)
    spans = receiver.wait_for(lambda s: len(_steps(s, "keras_predict")) >= 2, 20)
    names = {s.attributes["tf_otel.step.kind"]: s.name for s in _steps(spans)}
    assert names == {
        "keras_train": "rank 0 keras.train_function",
        "keras_evaluate": "rank 0 keras.test_function",
        "keras_predict": "rank 0 keras.predict_function",
    }
    assert _step_numbers(spans, "keras_train") == list(range(6))
    assert _step_numbers(spans, "keras_evaluate") == list(range(6))
    assert receiver.requests["http"] > 0 and receiver.requests["grpc"] == 0
    assert receiver.spans()[0].resource["service.name"] == "keras_fit"


def test_disabled_instrumentation_traces_nothing(receiver):
    env = base_env(
        **receiver.env("grpc"), STEPS="4", OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="tensorflow"
    )
    result = run([INSTRUMENT, python(), example("custom_loop.py")], env)
    assert "done steps=4" in result.stdout
    time.sleep(1.0)
    assert not [s for s in receiver.spans() if s.attributes.get("tf_otel.category")]


def test_traceparent_is_the_job_spans_parent(receiver):
    parent_trace, parent_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    env = base_env(
        **receiver.env("grpc"),
        STEPS="3",
        TF_OTEL_ENABLED="1",
        TRACEPARENT=f"00-{parent_trace}-{parent_span}-01",
        TRACESTATE="vendor=x",
    )
    run([python(), example("custom_loop.py")], env)
    spans = receiver.wait_for(lambda s: any(x.category == "job" for x in s), 20)
    job = next(s for s in spans if s.category == "job")
    assert (job.trace_id, job.parent_id) == (parent_trace, parent_span)
    roots = [
        s for s in receiver.wait_for(lambda s: len(_steps(s)) >= 3) if s.category == "step.root"
    ]
    assert roots and all(job.span_id in r.links for r in roots)


def test_file_output_is_otlp_json(receiver, tmp_path: Path):
    out = tmp_path / "spans.jsonl"
    env = base_env(**receiver.env("grpc"), STEPS="5", TF_OTEL_ENABLED="1", TF_OTEL_FILE=str(out))
    run([python(), example("custom_loop.py")], env)
    lines = out.read_text().splitlines()
    spans = [
        span
        for line in lines
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]
    steps = [
        s
        for s in spans
        if {"key": "tf_otel.category", "value": {"stringValue": "step"}} in s["attributes"]
    ]
    assert len(steps) == 5
    assert all(len(s["traceId"]) == 32 and len(s["spanId"]) == 16 for s in spans)
    assert all(int(s["endTimeUnixNano"]) >= int(s["startTimeUnixNano"]) for s in spans)


def _untraced_and_traced(extra_env):
    untraced = run([python(), example("custom_loop.py")], base_env(STEPS="30"))
    t0 = time.monotonic()
    traced = run(
        [python(), example("custom_loop.py")],
        base_env(STEPS="30", TF_OTEL_ENABLED="1", **extra_env),
        check=False,
    )
    return untraced, traced, time.monotonic() - t0


def test_missing_collector_changes_nothing_for_the_job():
    with refused_port() as port:  # no collector there, nor can one start there meanwhile
        untraced, traced, _ = _untraced_and_traced(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                "OTEL_BSP_SCHEDULE_DELAY": "100",
            }
        )
    assert traced.returncode == untraced.returncode == 0
    assert traced.stdout == untraced.stdout
    failures = [line for line in traced.stderr.splitlines() if "span export is failing" in line]
    assert len(failures) <= 2, traced.stderr  # one per exporter logger, not one per retry


def test_hanging_collector_does_not_hold_the_job():
    """A collector that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
        untraced, traced, _ = _untraced_and_traced(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_BSP_SCHEDULE_DELAY": "100",
            }
        )
    finally:
        stop.set()
        thread.join()
        server.close()
    assert traced.returncode == 0 and traced.stdout == untraced.stdout
    assert accepted, "the exporter never tried the hanging collector"


def test_bad_env_value_is_named_and_training_goes_on(receiver):
    env = base_env(
        **receiver.env("grpc"),
        STEPS="3",
        TF_OTEL_ENABLED="1",
        TF_OTEL_MAX_QUEUE="lots",
        TF_OTEL_ROOT_WAIT_MS="-5",
    )
    result = run([python(), example("custom_loop.py")], env)
    assert "done steps=3" in result.stdout
    assert "TF_OTEL_MAX_QUEUE='lots'" in result.stderr
    assert "TF_OTEL_ROOT_WAIT_MS='-5'" in result.stderr
    assert len(_steps(receiver.wait_for(lambda s: len(_steps(s)) >= 3))) == 3


def test_sigterm_flushes_spans_and_keeps_the_exit_status(receiver, tmp_path: Path):
    script = tmp_path / "forever.py"
    script.write_text(
        "import tensorflow as tf\n"
        "v = tf.Variable(1.0)\n"
        "@tf.function\n"
        "def train_step():\n"
        "    v.assign_add(1.0)\n"
        "    return v\n"
        "i = 0\n"
        "while True:\n"
        "    train_step(); i += 1\n"
        "    if i == 5: print('ready', flush=True)\n"
    )
    env = base_env(
        **{**receiver.env("grpc"), "OTEL_BSP_SCHEDULE_DELAY": "60000"}, TF_OTEL_ENABLED="1"
    )
    proc = subprocess.Popen(
        [python(), str(script)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == -signal.SIGTERM
    # the batch delay is a minute: these spans can only have come from the SIGTERM flush
    assert len(_steps(receiver.wait_for(lambda s: len(_steps(s)) >= 5, 10))) >= 5


def test_sigterm_ends_a_process_blocked_in_tensorflow(tmp_path: Path):
    """A parameter server sits in server.join(), in C++: Python's handler never runs there, so
    tf_otel's watchdog must still let SIGTERM end it, with the default exit status."""
    script = tmp_path / "ps.py"
    script.write_text(
        "import tensorflow as tf\n"
        "cluster = tf.train.ClusterSpec({'ps': ['127.0.0.1:0']})\n"  # a lone task: any free port
        "server = tf.distribute.Server(cluster, job_name='ps', task_index=0)\n"
        "print('serving', flush=True)\n"
        "server.join()\n"
    )
    env = base_env(TF_OTEL_ENABLED="1", OTEL_TRACES_EXPORTER="none")
    proc = subprocess.Popen(
        [python(), str(script)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "serving"
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == -signal.SIGTERM
    finally:
        proc.kill()
