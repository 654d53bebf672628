#!/usr/bin/env bash
# Run the whole suite with the project's venv; "no tests ran" (pytest exit 5) is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" PYTHONUNBUFFERED=1
.venv/bin/python -m pytest -p no:cacheprovider -ra --durations=15 "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "run_tests: pytest collected no tests - failing" >&2
  exit 1
fi
exit $rc
