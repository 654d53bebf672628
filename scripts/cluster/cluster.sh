#!/usr/bin/env bash
# The simulated cluster (network namespaces as hosts, sshd in each): see docs/guides/CLUSTER.md.
#   scripts/cluster/cluster.sh up [--hosts 2] [--slots 2] [--slow hostB=20mbit] [--cpus hostB=1] [--hog hostB=1]
#   scripts/cluster/cluster.sh status | down          # down is idempotent
#   scripts/cluster/cluster.sh exec -- horovodrun -np 4 -H hostA:2,hostB:2 --gloo .venv/bin/python train.py
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
py="$repo/.venv/bin/python"
[ -x "$py" ] || py="$(command -v python3)"
export PATH="$repo/.venv/bin:$PATH" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec "$py" "$here/netcluster.py" "$@"
