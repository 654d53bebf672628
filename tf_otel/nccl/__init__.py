"""NCCL and GPU sources: kernel names, XPlane GPU planes, the profiler plugin ring, NVML metrics.

- ``kernels``: parse ``ncclDevKernel_*`` / ``ncclKernel_*`` names.
- ``xplane_gpu``: TF profiler ``/device:GPU:<n>`` planes -> ``kernel`` Records, placed under
  the rank's ``collective`` Records.
- ``ring``: the NCCL profiler plugin's shared-memory ring -> ``kernel`` Records keyed by
  (``nccl.comm_hash``, ``nccl.seq``), the cross-rank key of one collective.
- ``gpu_metrics``: pynvml gauges (absent without a GPU or driver).

Nothing here imports TensorFlow or pynvml at import time. See docs/NCCL.md.
"""
