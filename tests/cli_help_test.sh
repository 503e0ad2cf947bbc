#!/usr/bin/env bash
# Every binary and every command of `tophat` answers --help with its usage and exits 0.
set -euo pipefail
bin="$1"
bin_dir="$(dirname "$bin")"
# The help is captured whole before it is searched: `grep -q` exits at its first match, and a
# help longer than the stdout buffer would then die of SIGPIPE (a failure under pipefail).
grep -q "Subcommands:" <<< "$("$bin" --help)"
for cmd in toy-model distill split generate bench-model bench-dtype init-model plan simulate devices chat bench; do
  help=$("$bin" "$cmd" --help) || { echo "tophat $cmd --help failed"; exit 1; }
  grep -q "Usage:" <<< "$help" || { echo "no usage for $cmd"; exit 1; }
done
for daemon in tophat-cloud tophat-agent; do
  help=$("$bin_dir/$daemon" --help) || { echo "$daemon --help failed"; exit 1; }
  grep -q -- "--config" <<< "$help" || { echo "no usage for $daemon"; exit 1; }
done
# Every benchmark the tree builds: a missing one is a failure, not a silent pass.
for bench in tophat-bench-speculative tophat-bench-engine tophat-bench-transport tophat-bench-pipeline \
    tophat-bench-flood tophat-bench-agent-memory tophat-bench-conversation tophat-bench-outline; do
  [ -x "$bin_dir/$bench" ] || { echo "$bench is missing from $bin_dir"; exit 1; }
  help=$("$bin_dir/$bench" --help) || { echo "$bench --help failed"; exit 1; }
  grep -q "Usage:" <<< "$help" || { echo "no usage for $bench"; exit 1; }
done
# An unknown subcommand is named and refused, --help or not.
err=$(mktemp)
for args in "NOSUCH" "NOSUCH --help"; do
  # shellcheck disable=SC2086
  if "$bin" $args >/dev/null 2>"$err"; then
    echo "tophat $args exited 0"; exit 1
  fi
  grep -q "unknown subcommand 'NOSUCH'" "$err" ||
    { echo "tophat $args did not name the unknown subcommand:"; cat "$err"; exit 1; }
done
rm -f "$err"
# A daemon with a bad flag says so and exits non-zero.
if "$bin_dir/tophat-cloud" --no-such-flag >/dev/null 2>&1; then
  echo "tophat-cloud accepted an unknown flag"; exit 1
fi
echo "all --help pages print"
