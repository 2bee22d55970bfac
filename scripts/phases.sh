# shellcheck shell=bash
# Phase timing for CI: `phase NAME command...` runs the command and, when
# HOURGLASS_PHASES names a file, appends its name, seconds and exit status;
# `print_phases` prints that file as a table (.ci/run does at the end).

phase() {
  local name=$1 start=$SECONDS status=0
  shift
  "$@" || status=$?
  if [[ -n "${HOURGLASS_PHASES:-}" ]]; then
    printf '%s\t%s\t%s\n' "$name" "$((SECONDS - start))" "$status" >>"$HOURGLASS_PHASES"
  fi
  return "$status"
}

print_phases() {
  [[ -n "${HOURGLASS_PHASES:-}" && -f "$HOURGLASS_PHASES" ]] || return 0
  awk -F'\t' '
    BEGIN { printf "\n%-34s %9s  %s\n", "phase", "seconds", "status"; total = 0 }
    { printf "%-34s %9d  %s\n", $1, $2, ($3 == 0 ? "ok" : "FAILED (" $3 ")") }
  ' "$HOURGLASS_PHASES"
}
