#!/usr/bin/env bash
# Build the tf_otel NCCL profiler plugin from a clone:
#   tf_otel/nccl/plugin/libnccl-profiler-tf_otel.so   (or $1 when given)
# The build itself is tf_otel/nccl/plugin/build.sh, shipped in the package (`tf-otel nccl-plugin`
# runs it after a pip install); this looks for nccl.h in the project's venv too.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$here/.venv/bin/python}" exec bash "$here/tf_otel/nccl/plugin/build.sh" "$@"
