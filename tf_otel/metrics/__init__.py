"""Metric producers: tf_otel's own health, host and process metrics, NVML GPU gauges, step
histograms with exemplars. Imports tf_otel.otel (the meter provider) and base modules only."""
