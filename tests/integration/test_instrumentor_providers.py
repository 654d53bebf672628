"""``instrument(tracer_provider=..., meter_provider=...)`` as the OpenTelemetry contrib
instrumentations take them: step spans and tf_otel's metrics go to the given providers, and the
global SDK is left alone. Real TF, a tf.function loop, in a process of its own."""

from __future__ import annotations

import pytest
from conftest import base_env, python, run

pytestmark = pytest.mark.integration

SCRIPT = """
import tf_otel
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
reader = InMemoryMetricReader()
tf_otel.instrument(tracer_provider=tracer_provider, meter_provider=MeterProvider([reader]))
import tensorflow as tf

@tf.function
def train_step(x):
    return x * 2.0

for _ in range(5):
    train_step(tf.constant(1.0))
tf_otel.shutdown()
spans = exporter.get_finished_spans()
steps = [s.attributes.get("tf_otel.step") for s in spans
         if s.attributes.get("tf_otel.category") == "step"]
print("STEPS", sorted(steps))
data = reader.get_metrics_data()
print("METRICS", sorted({m.name for rm in data.resource_metrics for sm in rm.scope_metrics
                         for m in sm.metrics}))
print("GLOBAL", type(trace.get_tracer_provider()).__name__)
"""


def test_given_providers_get_the_steps_and_metrics_and_the_global_sdk_is_left_alone():
    result = run([python(), "-c", SCRIPT], base_env(), timeout=240)
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert lines.get("STEPS") == "[0, 1, 2, 3, 4]", result.stdout + result.stderr[-2000:]
    assert "'tf_otel.step.duration'" in lines["METRICS"]
    assert lines["GLOBAL"] == "ProxyTracerProvider"  # not configured from OTEL_* behind our back
