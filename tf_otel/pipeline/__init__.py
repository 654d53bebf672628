"""The runtime between sources and exported spans: steps, cross-rank coordination, metrics.

Sources (``tf_otel.sources``, ``tf_otel.nccl``, ``tf_otel.instrument``) hand ``record.Record``s
to the one ``Pipeline`` of the process (``lifecycle.get_pipeline()``); its export thread maps
them to reference time and emits spans; rank 0's coordinator emits each step's cross-rank root.

Rooms: ``steps`` (Pipeline: step queue, span building), ``ids`` (cross-rank step ids),
``lifecycle`` (the singleton, ``with_pipeline``, shutdown), ``signals`` (exit / SIGTERM),
``messages`` (cross-rank message types, encode / decode, handlers), ``coordinator`` (rank 0's
step service), ``stall`` (steps in flight, rank 0's stall watch and record), ``record`` (the
Record type), ``sdk``, ``delivery``, ``span_builder`` and ``otlp_json`` (SDK set-up, export
accounting, spans and the OTLP-JSON file), ``health_metrics``, ``system_metrics``,
``gpu_metrics`` and ``step_metrics`` (metrics producers). Who and where the process is in the
job: ``tf_otel.job``.
"""
