#!/usr/bin/env bash
# GPU-side checks of tf_otel (docs/guides/NCCL.md, "Verified on a GPU"): run from the repository root
# on a machine with one NVIDIA GPU, python3 with torch (+ its NCCL), jax[cuda], pynvml, gcc;
# opentelemetry-api/-sdk either installed or as wheels in .whl/ (installed into /tmp/site).
#
#   scripts/gpu_check.sh OUTDIR [TOTAL_SECONDS] [STEPS...]
#
# STEPS (default: all, in this order): build plugin_cost env nccl xplane nvml bench. Each step
# has its own time limit, bounded by what is left of TOTAL_SECONDS (default 280); one failing
# does not stop the next. Everything (logs, JSON, rings, the XSpace) lands in OUTDIR, at most 8 files:
#   gpu_check.log env.json nccl_run.json nccl_run.tar.gz xplane.json jax_gpu.xplane.pb.gz
#   nvml.json bench.json
set -u
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_steps_begin gpu_check 280 "build plugin_cost env nccl xplane nvml bench" "$@"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
py="${PYTHON:-python3}"
plugin="/tmp/tf_otel_gpu_check/libnccl-profiler-tf_otel.so"
mkdir -p "$(dirname "$plugin")"

if ls .whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >>"$logf" 2>&1 && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

step build 40 env PYTHON="$py" scripts/build_nccl_plugin.sh "$plugin"
if [[ " $steps " == *" build "* && ! -f "$plugin" ]]; then  # e.g. the nccl.h check failed
  echo "=== build: plain gcc, vendored ABI header only" | tee -a "$logf"
  gcc -std=c11 -O2 -fPIC -shared -fvisibility=hidden -pthread -Itf_otel/nccl/plugin \
    -o "$plugin" tf_otel/nccl/plugin/tf_otel_nccl_profiler.c 2>&1 | tee -a "$logf"
fi
step plugin_cost 40 bash -c "gcc -O2 -std=c11 -Itf_otel/nccl/plugin -o /tmp/tf_otel_gpu_check/cost \
  scripts/nccl_plugin_cost.c -ldl && TF_OTEL_NCCL_RING_DIR=/tmp/tf_otel_gpu_check \
  /tmp/tf_otel_gpu_check/cost $plugin; rm -f /tmp/tf_otel_gpu_check/tf_otel_nccl_*"
step env 60 "$py" scripts/gpu_check.py env --out "$out"
step nccl 110 "$py" scripts/gpu_check.py nccl --plugin "$plugin" --world 1 2 --ops 400 \
  --timeout 45 --out "$out" --bundle --profile-kernels
step xplane 70 "$py" scripts/gpu_check.py xplane --out "$out"
step nvml 40 "$py" scripts/gpu_check.py nvml --out "$out"
step bench 150 "$py" scripts/gpu_check.py bench --plugin "$plugin" --rounds 4 --ops 200 \
  --batches 4 --pin --out "$out"
ls -la "$out" | tee -a "$logf"
exit 0
