"""Cross-rank trace analysis behind ``tf-otel analyze``.

Pipeline: ``load`` (OTLP-JSON files, Jaeger, Tempo) -> ``steps`` (one ``StepTrace`` per step
trace) -> ``critical_path`` (per step, across ranks) and ``measured`` (which of its categories
the step's spans measured) -> ``stragglers`` / ``outliers`` (across steps) -> ``findings`` ->
``report`` (terminal, JSON, HTML, PNG).

Usage::

    from tf_otel.analysis.analyze import analyze_spans
    from tf_otel.analysis.load.files import load_paths

    result = analyze_spans(load_paths(["traces/"]))
    print(result.findings)

This package never imports TensorFlow.
"""
