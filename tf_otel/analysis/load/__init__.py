"""Loaders: OTLP-JSON files (``otlp_json``), Jaeger query API (``jaeger``), Tempo (``tempo``).

Each returns a list of ``tf_otel.analysis.model.Span``; bad input raises ``AnalysisError``.
"""
