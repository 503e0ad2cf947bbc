#!/usr/bin/env bash
# Every command of `tophat` answers --help with its usage and exits 0.
set -euo pipefail
bin="$1"
"$bin" --help | grep -q "Subcommands:"
for cmd in toy-model split generate bench-model init-model; do
  "$bin" "$cmd" --help | grep -q "Usage:" || { echo "no usage for $cmd"; exit 1; }
done
echo "all --help pages print"
