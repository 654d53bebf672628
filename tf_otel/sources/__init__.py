"""Sources: pure parsers of TensorFlow, Horovod, XSpace and NCCL artifacts -> Records
(step_stats, xplane, xplane_gpu, horovod_timeline, horovod_stamp_records). Nothing here imports
Horovod; TensorFlow only to read an XSpace protobuf (xplane)."""
