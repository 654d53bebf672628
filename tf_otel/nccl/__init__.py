"""NCCL sources: kernel names and the profiler plugin's ring.

- ``kernels``: parse ``ncclDevKernel_*`` / ``ncclKernel_*`` names.
- ``ring``: the NCCL profiler plugin's shared-memory ring -> ``kernel`` Records keyed by
  (``nccl.comm_hash``, ``nccl.collective``, ``nccl.seq``), the cross-rank key of one
  collective (NCCL numbers collectives per type).
- ``plugin/``: the plugin's C source and its ``build.sh`` (``tf-otel nccl-plugin`` runs it:
  ``nccl_plugin_cli``; where the built library goes: ``plugin_files``).

XPlane GPU planes are parsed in ``tf_otel.sources.xplane_gpu``; NVML gauges come from
``tf_otel.metrics.gpu_metrics``. Nothing here imports TensorFlow or pynvml at import time.
See docs/guides/NCCL.md.
"""
