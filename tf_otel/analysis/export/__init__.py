"""``tf-otel export``: selected steps of a run as a Chrome trace-event JSON file.

The file opens in ui.perfetto.dev and chrome://tracing: every rank is a process, every span
category a track, collectives are flows between ranks (``chrome_trace.build_trace``).
"""
