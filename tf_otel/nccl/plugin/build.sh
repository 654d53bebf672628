#!/usr/bin/env bash
# Build the tf_otel NCCL profiler plugin (the *.c beside this script, shipped in the package)
# into libnccl-profiler-tf_otel.so beside it (or $1 when given). Run by `tf-otel nccl-plugin`
# (an installed package) and scripts/build_nccl_plugin.sh (a clone).
# Needs only a C compiler: the profiler ABI is vendored in nccl_profiler_abi.h. When nccl.h is
# found (NCCL_HOME, CUDA_HOME, /usr/include, /usr/local/cuda, or the nvidia-nccl-cu* wheel in
# PYTHON's site-packages) it is also compiled against it as a check, and its version reported.
# Exits 0 with a "skipped:" line when no compiler is available (the plugin is optional).
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$src/libnccl-profiler-tf_otel.so}"
cc="${CC:-gcc}"
python="${PYTHON:-python3}"  # where to look for the nvidia-nccl-cu* wheel's nccl.h

if ! command -v "$cc" >/dev/null 2>&1; then
  echo "[nccl-plugin] skipped: no C compiler ($cc) on PATH; NCCL profiler plugin not built"
  exit 0
fi

nccl_inc=""
for d in "${NCCL_HOME:+$NCCL_HOME/include}" "${CUDA_HOME:+$CUDA_HOME/include}" \
         /usr/include /usr/local/cuda/include; do
  if [ -n "$d" ] && [ -f "$d/nccl.h" ]; then nccl_inc="$d"; break; fi
done
if [ -z "$nccl_inc" ] && [ -x "$python" ]; then
  nccl_inc="$("$python" - <<'PY' 2>/dev/null || true
import glob, os, site, sys
for p in site.getsitepackages() + [site.getusersitepackages()]:
    for h in glob.glob(os.path.join(p, "nvidia", "nccl", "include", "nccl.h")):
        print(os.path.dirname(h)); sys.exit(0)
PY
)"
fi

flags=(-std=c11 -O2 -fPIC -shared -fvisibility=hidden -Wall -Wextra -Werror
       -Wno-unused-parameter -pthread)
if [ -n "$nccl_inc" ]; then
  h="$nccl_inc/nccl.h"
  ver="$(sed -n 's/^#define NCCL_VERSION_CODE \([0-9]*\).*/\1/p' "$h" | head -1)"
  echo "[nccl-plugin] nccl.h found in $nccl_inc (NCCL_VERSION_CODE=${ver:-?})"
  if [ -n "$ver" ] && [ "$ver" -lt 22300 ]; then
    echo "[nccl-plugin] note: NCCL < 2.23 has no profiler plugin interface; it will not load the plugin"
  fi
  # nccl.h includes the CUDA runtime headers but only needs two handle types from them: when
  # no CUDA toolkit is installed, a stub declaring just those lets the ABI check compile.
  cuda_inc=""
  for d in "${CUDA_HOME:+$CUDA_HOME/include}" /usr/local/cuda/include; do
    if [ -n "$d" ] && [ -f "$d/cuda_runtime.h" ] && [ -f "$d/crt/host_config.h" ]; then
      cuda_inc="$d"; break
    fi
  done
  if [ -z "$cuda_inc" ]; then
    cuda_inc="$(mktemp -d)"
    trap 'rm -rf "$cuda_inc"' EXIT
    printf '%s\n' 'typedef struct CUstream_st *cudaStream_t;' \
      'typedef struct CUevent_st *cudaEvent_t;' > "$cuda_inc/cuda_runtime.h"
    : > "$cuda_inc/cuda_fp16.h"; : > "$cuda_inc/cuda_bf16.h"; : > "$cuda_inc/cuda_fp8.h"
    echo "[nccl-plugin] no CUDA toolkit headers: using a 2-typedef cuda_runtime.h stub for the check"
  fi
  echo "[nccl-plugin] compiling against nccl.h as an ABI check"
  flags+=(-DTF_OTEL_WITH_NCCL_H "-I$nccl_inc" "-I$cuda_inc")
else
  echo "[nccl-plugin] nccl.h not found: building against the vendored ABI header only"
fi

"$cc" "${flags[@]}" -I"$src" -o "$out" "$src/tf_otel_nccl_profiler.c"
for sym in ncclProfiler_v1 ncclProfiler_v2 ncclProfiler_v3 ncclProfiler_v4 ncclProfiler_v5; do
  if ! nm -D --defined-only "$out" | grep -q " $sym\$"; then
    echo "[nccl-plugin] error: $out does not export $sym" >&2
    exit 1
  fi
done
echo "[nccl-plugin] built $out"
echo "[nccl-plugin] enable with: NCCL_PROFILER_PLUGIN=$out"
