"""tf_otel: OpenTelemetry tracing for distributed TensorFlow training."""

__version__ = "0.1.0"
