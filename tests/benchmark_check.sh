#!/usr/bin/env bash
# A benchmark's smoke test that can fail: runs the benchmark with --json FILE, fails on its
# exit status, then evaluates a Python expression over the report (`r`, the parsed JSON) and
# fails unless it is true. A benchmark that prints its table after every request failed, or
# that exits non-zero, fails here (a PASS_REGULAR_EXPRESSION on the table would not).
#
#   bash tests/benchmark_check.sh 'EXPRESSION' PROGRAM ARGS...
set -uo pipefail
if [ $# -lt 2 ] || [ "$1" = --help ]; then
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
  [ "${1:-}" = --help ] && exit 0 || exit 2
fi
expression=$1
shift
report=$(mktemp --suffix=.json)
trap 'rm -f "$report"' EXIT
"$@" --json "$report"
status=$?
if [ $status -ne 0 ]; then
  echo "benchmark_check: $1 exited with status $status" >&2
  exit 1
fi
python3 - "$report" "$expression" <<'PY'
import json, sys
with open(sys.argv[1]) as f:
    r = json.load(f)
expression = sys.argv[2]
value = eval(expression, {"r": r, "all": all, "any": any, "len": len})
print(f"benchmark_check: {expression} -> {value}")
sys.exit(0 if value is True else 1)
PY
