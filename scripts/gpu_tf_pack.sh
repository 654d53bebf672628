#!/usr/bin/env bash
# Pack TensorFlow (GPU build) for a lent GPU machine that has no TensorFlow and no network
# (docs/guides/NCCL.md, "TensorFlow on the GPU machine"). Here, in the repository root:
#
#   scripts/gpu_tf_pack.sh [PART_MIB]          # default 57
#
# writes .tfgpu/ (ignored by git):
#   .tfgpu/pNN/tf.tar.xz.NN   the TF wheel's package without headers, its shared objects
#                             stripped of their static symbol tables, as one tar.xz in parts
#   .tfgpu/whl/*.whl          what TF, Keras and tf_otel need that the machine lacks or has in
#                             another version (cp312), the CUDA 12 runtime and CUPTI, tf_otel
# A device call carries at most 64 MiB, so each part travels in its own call
# (`carry: [".tfgpu/pNN"]`); a warm machine keeps /tmp between calls, where each call moves its
# part. The last call carries the last part and .tfgpu/whl and runs scripts/gpu_tf_check.sh.
set -euo pipefail
part_mib="${1:-57}"
tf_version="${TF_VERSION:-2.21.0}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${TF_OTEL_CACHE:-$HOME/.cache/tf_otel}/gpu_tf"
out="$root/.tfgpu"
py="${PYTHON:-python3}"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64)
mkdir -p "$cache" "$out"
grep -qx '/.tfgpu/' "$root/.git/info/exclude" 2>/dev/null || echo '/.tfgpu/' >> "$root/.git/info/exclude"

if [ ! -f "$cache/tf.tar.xz" ]; then
  "$py" -m pip download -q --no-deps "${plat[@]}" -d "$cache" "tensorflow==$tf_version"
  rm -rf "$cache/tree" && mkdir -p "$cache/tree"
  (cd "$cache/tree" && unzip -q "$cache"/tensorflow-"$tf_version"-*.whl \
     -x 'tensorflow/include/*' 'tensorflow/xla_aot_runtime_src/*')
  # .symtab/.strtab only: the dynamic symbols TF and its extensions link by stay
  find "$cache/tree" -name '*.so*' -size +100k -exec strip -s {} \;
  (cd "$cache/tree" && tar -cf - tensorflow tensorflow-"$tf_version".dist-info) \
    | xz -6 -T2 > "$cache/tf.tar.xz.tmp"
  mv "$cache/tf.tar.xz.tmp" "$cache/tf.tar.xz"
  rm -rf "$cache/tree"
fi
rm -rf "$out"/p[0-9]* "$out/whl"
split -b "${part_mib}M" -d -a 2 "$cache/tf.tar.xz" "$out/tf.tar.xz."
for f in "$out"/tf.tar.xz.*; do
  n="${f##*.}"; mkdir -p "$out/p$n"; mv "$f" "$out/p$n/"
done

mkdir -p "$out/whl"
"$py" -m pip download -q "${plat[@]}" -d "$cache/whl" \
  "keras>=3.12,<4" "tf_keras~=${tf_version%.*}.0" "protobuf>=6.31.1,<8" "ml_dtypes>=0.5.1,<1" \
  "h5py>=3.11,<3.15" astunparse "gast>=0.6" google_pasta termcolor "flatbuffers>=25.9.23" \
  opt_einsum "wrapt>=1.14" "numpy>=1.26,<2.5" opentelemetry-api opentelemetry-sdk \
  opentelemetry-exporter-otlp opentelemetry-instrumentation opentelemetry-distro \
  opentelemetry-instrumentation-system-metrics opentelemetry-instrumentation-logging \
  nvidia-cuda-runtime-cu12==12.5.82 nvidia-cuda-cupti-cu12==12.5.82
# what the machine's image already has (docs/guides/NCCL.md) stays out, but numpy: TF 2.21 came out
# before the image's numpy 2.5
(cd "$cache/whl" && rm -f grpcio-* pygments-* rich-* markdown_it* mdurl* \
   charset_normalizer* certifi* urllib3* idna* requests-* psutil* packaging-* \
   typing_extensions* wheel-* setuptools* six-* tensorflow-* libclang-*)
cp "$cache"/whl/*.whl "$out/whl/"
"$py" -m pip wheel -q --no-deps -w "$out/whl" "$root"
du -sh "$out"/p* "$out/whl"
echo "[gpu_tf_pack] $(ls -d "$out"/p* | wc -l) parts; the last call carries the last part and .tfgpu/whl"
