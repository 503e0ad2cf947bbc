# Sourced by the test scripts: `logged LOG WHAT COMMAND...` runs COMMAND with its output in
# LOG, and on failure prints the log's last lines and "WHAT failed" to stderr. Under CTest a
# failing test prints all of its output, and hundreds of build lines would push the failure
# itself out of a CI summary.
logged() {
  local log="$1" what="$2"
  shift 2
  mkdir -p "$(dirname "$log")"
  if ! "$@" >"$log" 2>&1; then
    tail -60 "$log" >&2
    echo "$what failed (whole log: $log)" >&2
    return 1
  fi
}
