"""The step on the training thread and its way out: the Pipeline (steps), the export thread,
the process's one pipeline and its end (lifecycle, signals), gathers over rank 0's link.
Sources hand it Records; it may import every room below it (cluster, metrics, otel)."""
