"""Pure parsers: TensorFlow / Horovod artifacts -> Records (step_stats, xplane, horovod_timeline).
Nothing here imports TensorFlow or Horovod."""
