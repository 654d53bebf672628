"""The runtime between sources and exported spans: steps, cross-rank coordination, metrics.

Sources (``tf_otel.sources``, ``tf_otel.instrument``) hand ``record.Record``s to the one
``Pipeline`` of the process (``lifecycle.get_pipeline()``); its export thread maps them to
reference time and emits spans; rank 0's coordinator emits each step's cross-rank root.

Rooms: ``steps`` (Pipeline: step queue, span building), ``ids`` (cross-rank step ids),
``lifecycle`` (the singleton, shutdown), ``signals`` (exit / SIGTERM), ``coordinator`` and
``job_secret`` (rank 0's step service), ``topology`` (rank, world, launcher), ``record`` (the
Record type), ``sdk`` and ``delivery`` (OpenTelemetry SDK set-up, export accounting),
``health_metrics`` and ``system_metrics`` (metrics producers).
"""
