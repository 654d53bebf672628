"""Run a training example, then ask TF itself which ops one more call of its training function
runs: TF's own profiler around that single call, its host-plane op events (``<name>:<Type>``)
read with TF's own XPlane proto. Writes ``{"rank", "ops": [[op name, op type], ...]}`` to
REFERENCE_FILE (``{rank}`` in it becomes the Horovod rank), so tests compare tf_otel's op spans
with the kernels TF picked on THIS machine (``MatMul`` or oneDNN's ``_MklMatMul``, fused or not)
instead of naming op types.

Usage: python tests/ops/scripts/reference_profile.py examples/keras_fit.py   (or horovod_tape.py)
The extra call is one more step of the example's step key (step STEPS).
"""

import glob
import json
import os
import runpy
import shutil
import sys
import tempfile

example = sys.argv[1]
sys.argv = [example] + sys.argv[2:]
scope = runpy.run_path(example, run_name="__main__")  # the example's own training, as usual

import tensorflow as tf  # noqa: E402
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

rank = os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
name = os.path.basename(example)
if name == "keras_fit.py":
    model = scope["model"]
    iterator = iter(scope["data"].repeat())  # made outside the profile: only the step inside

    def one_step():
        model.train_function(iterator)
elif name == "horovod_tape.py":
    features, labels, slow = scope["features"], scope["labels"], tf.constant(False)

    def one_step():
        scope["train_step"](features, labels, slow)
else:
    raise SystemExit(f"reference_profile.py: no training function known for {name}")

logdir = tempfile.mkdtemp(prefix="reference_profile_")
options = tf.profiler.experimental.ProfilerOptions(
    host_tracer_level=2, python_tracer_level=0, device_tracer_level=1
)
tf.profiler.experimental.start(logdir, options=options)
one_step()
tf.profiler.experimental.stop()
ops = set()
for path in glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")):
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for md in plane.event_metadata.values():  # TF op events: "<op name>:<Type>", display Type
            if md.display_name and md.name.endswith(":" + md.display_name):
                ops.add((md.name[: -len(md.display_name) - 1], md.display_name))
shutil.rmtree(logdir, ignore_errors=True)
with open(os.environ["REFERENCE_FILE"].format(rank=rank), "w") as out:
    json.dump({"rank": int(rank), "ops": sorted(ops)}, out)
print(f"rank {rank} reference ops={len(ops)}", flush=True)
