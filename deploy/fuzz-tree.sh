#!/usr/bin/env bash
# Builds the `fuzz` preset's tree (clang, AddressSanitizer + UBSan) with everything the test
# suite runs from it, in one build: the libFuzzer targets (deploy/fuzz.sh), and the sanitized
# daemons, serving test binary and unit tests (deploy/sanitize.sh). One ninja run schedules
# them over the cores. The suite then runs the fuzz replay, the sanitized serving cases and
# the unit tests beside each other on this tree (`deploy/fuzz.sh --prebuilt`,
# `deploy/sanitize.sh --prebuilt [--unit]`), which could not each build it: two builds at
# once in one tree would clash.
#
#   bash deploy/fuzz-tree.sh
#
# Exits 77 (CTest's "skipped") when clang++ is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
  *) echo "fuzz-tree: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac
if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz-tree: clang++ not found (deploy/install-deps.sh installs clang); skipped" >&2
  exit 77
fi
started=$(date +%s)
source deploy/logged.sh
logged build/fuzz-configure.log "fuzz tree: configuring" cmake --preset fuzz
logged build/fuzz-build.log "fuzz tree: the build" cmake --build --preset fuzz -j "$(nproc)" \
  --target tophat_fuzzers tophat-cloud tophat-agent tophat_serving_test tophat_unit_tests
echo "fuzz tree: built in $(( $(date +%s) - started )) s (log: build/fuzz-build.log)"
