#!/usr/bin/env bash
# TensorFlow GPU checks of tf_otel (docs/guides/NCCL.md, "TensorFlow on a GPU"), on a lent
# machine with one NVIDIA GPU, python3.12 (its torch's CUDA 13 wheels: cuBLAS, cuDNN, NCCL ...),
# pynvml and gcc, but no TensorFlow: the parts scripts/gpu_tf_pack.sh made, already moved into
# /tmp/tfparts by the calls that carried them, and the wheels in .tfgpu/whl.
#
#   scripts/gpu_tf_check.sh OUTDIR [TOTAL_SECONDS] [STEPS...]
#
# STEPS (default: all): setup probe traced xspace mwms cost; setup, libs and probe first, the
# rest in the order given. Each has its own time limit, bounded by what is left of TOTAL_SECONDS
# (default 420); one failing does not stop the next ("setup" is skipped once done: /tmp keeps it
# while the machine stays warm). COST_STEPS / COST_BUDGET_S / COST_LIMIT_S size the cost step.
# At most 8 files land in OUTDIR: gpu_tf_check.log libs.json probe.json traced.tar.gz
# tf_gpu.xplane.pb.gz mwms.tar.gz cost.json
set -u
source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
gpu_steps_begin gpu_tf_check 420 "setup probe traced xspace mwms cost" "$@"
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}"
export CUDA_CACHE_PATH=/tmp/tf_otel_nvcache CUDA_CACHE_MAXSIZE=4294967296  # PTX JIT, once
site=/tmp/tfsite   # TensorFlow, unpacked
wheels=/tmp/site   # the carried wheels, tf_otel's among them
boot=/tmp/tfboot   # sitecustomize: /tmp/site as a site dir, so tf_otel-autostart.pth runs

setup() {
  if [ -f "$site/.done" ]; then echo "already set up"; return 0; fi
  ls -la /tmp/tfparts
  mkdir -p "$site" && cat /tmp/tfparts/tf.tar.xz.* | xz -T0 -dc | tar -x -C "$site" || return 1
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$wheels" .tfgpu/whl/*.whl || return 1
  mkdir -p "$boot"
  printf 'import site\nsite.addsitedir("%s")\n' "$wheels" > "$boot/sitecustomize.py"
  # the wheel holds no C sources: the plugin is built from the checkout where tf_otel looks for it
  mkdir -p "$wheels/tf_otel/nccl/plugin"
  local so="$wheels/tf_otel/nccl/plugin/libnccl-profiler-tf_otel.so"
  env PYTHON="$py" scripts/build_nccl_plugin.sh "$so" || gcc -std=c11 -O2 -fPIC -shared \
    -fvisibility=hidden -pthread -Itf_otel/nccl/plugin -o "$so" tf_otel/nccl/plugin/tf_otel_nccl_profiler.c
  touch "$site/.done"
}
case " $steps " in *" setup "*)  # no timeout: a shell function (unpacking takes ~10 s)
  echo "=== setup $(date -u +%T)" | tee -a "$logf"; setup 2>&1 | tee -a "$logf"
  echo "=== setup rc=${PIPESTATUS[0]} $(date -u +%T)" | tee -a "$logf" ;; esac
# PYTHONPATH before site-packages: the carried protobuf / wrapt / keras win over the image's
export PYTHONPATH="$wheels:$site:$boot"
purelib="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
ldp="$("$py" scripts/gpu_tf_check.py libs --out "$out" \
      --search "$wheels/nvidia:$purelib/nvidia:/usr/local/cuda/lib64" 2>>"$logf" | tail -1)"
export LD_LIBRARY_PATH="$ldp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" | tee -a "$logf"

model="${GPU_TF_MODEL:-ResNet50}"  # GPU_TF_MODEL=mlp GPU_TF_DEVICE=cpu: a CPU dry run
dev=(--device "${GPU_TF_DEVICE:-gpu}")
TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=dso_loader=1 step probe 90 "$py" scripts/gpu_tf_check.py probe --out "$out"
case $? in
  0) ;;
  3) model=mlp; echo "=== conv failed on the GPU: the MLP instead of ResNet50" | tee -a "$logf" ;;
  *) case " $steps " in *" probe "*) echo "=== no usable GPU under TF: stopping" | tee -a "$logf"
       ls -la "$out"; exit 0 ;; esac ;;
esac
t=("$py" scripts/gpu_tf_check.py)
m=(--model "$model" --out "$out" "${dev[@]}")
# in the order STEPS names them
for name in $steps; do case $name in
  traced) step traced 200 "${t[@]}" traced "${m[@]}" --steps 40 --timeout 150 ;;
  xspace) step xspace 60 "${t[@]}" xspace "${m[@]}" --timeout 55 ;;
  mwms) step mwms 90 "${t[@]}" mwms --steps 30 --timeout 80 --out "$out" "${dev[@]}" ;;
  cost) step cost "${COST_LIMIT_S:-170}" "${t[@]}" cost "${m[@]}" --steps "${COST_STEPS:-60}" \
    --rounds 3 --warmup 15 --budget-s "${COST_BUDGET_S:-150}" --timeout 60 ;;
esac; done
ls -la "$out" | tee -a "$logf"
exit 0
