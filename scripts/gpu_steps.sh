# Sourced by scripts/gpu_check.sh and scripts/gpu_tf_check.sh: their arguments, log, time budget
# and step runner.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/gpu_steps.sh"
#   gpu_steps_begin LOG_NAME DEFAULT_TOTAL_SECONDS "DEFAULT STEPS" "$@"
#       # OUTDIR [TOTAL_SECONDS] [STEPS...] -> out (absolute), steps, logf, deadline
#   step NAME LIMIT_SECONDS CMD...
#       # CMD with min(LIMIT, time left - 5 s), its output into the log; its status (0 when NAME
#       # is not in STEPS or no time is left)

gpu_steps_begin() {
  local name="$1" default_total="$2" default_steps="$3"
  shift 3
  out="${1:?usage: $0 OUTDIR [TOTAL_SECONDS] [STEPS...]}"
  local total="${2:-$default_total}"
  shift $(( $# >= 2 ? 2 : 1 ))
  steps="${*:-$default_steps}"
  mkdir -p "$out"
  out="$(cd "$out" && pwd)"
  logf="$out/$name.log"
  deadline=$(( $(date +%s) + total ))
}

step() {
  local name="$1" limit="$2"; shift 2
  case " $steps " in *" $name "*) ;; *) return 0 ;; esac
  local left=$(( deadline - $(date +%s) - 5 ))
  (( left < limit )) && limit=$left
  if (( limit < 5 )); then echo "=== $name skipped: no time left" | tee -a "$logf"; return 0; fi
  echo "=== $name (limit ${limit}s) $(date -u +%T)" | tee -a "$logf"
  timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$logf"
  local rc=${PIPESTATUS[0]}
  echo "=== $name rc=$rc $(date -u +%T)" | tee -a "$logf"
  return "$rc"
}
