"""The cross-rank service: rank 0's coordinator and its clients, host relays, the messages and
their framing, stalls, live verdicts, the changing world, the live baseline, a rank's services.
Imports tf_otel.otel, tf_otel.metrics, clock/, job/ and base modules; never tf_otel.runtime."""
