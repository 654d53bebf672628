"""OpenTelemetry SDK wiring: providers and exporters from OTEL_*, the OTLP-JSON file, spans built
straight into the SDK's processors, step ids handed to the SDK, delivery accounting. The only
home of SDK internals. Imports no other runtime room (tf_otel base modules only)."""
