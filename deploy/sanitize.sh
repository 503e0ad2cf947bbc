#!/usr/bin/env bash
# The serving tests under AddressSanitizer + UBSan. Builds tophat-cloud, tophat-agent and
# the serving test binary in the `fuzz` preset's tree (clang, ASan + UBSan: one
# sanitized build, shared with the fuzz targets), then runs the serving cases against those
# sanitized daemons on a toy model that an ordinary build trained (training it under ASan
# would add minutes and test nothing the serving cases do not).
#
#   bash deploy/sanitize.sh --toy-model DIR [CATCH_TEST_SPEC...]   (any of the specs)
#
# The default spec is "[serving]~[timing]~[numerics]~[memory]": the [timing] cases estimate
# link and compute rates from real transfers and need release-speed daemons, the [numerics]
# case gathers agreement statistics over 100 prompts through code paths shorter cases cover,
# and the [memory] case measures resident memory, which under ASan is its allocator's and its
# quarantine's (all three run in the release suite).
#
# Every process writes its sanitizer reports to a scratch directory; any report fails the
# run, even one from a daemon the test had already finished with. Exits 77 (CTest's
# "skipped") when clang++ is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

toy_model=""
specs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --toy-model) toy_model="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) specs+=("$1"); shift ;;
  esac
done
if [ -z "$toy_model" ] || [ ! -f "$toy_model/config.json" ]; then
  echo "sanitize: --toy-model DIR must name a trained toy model (tophat toy-model --out DIR)" >&2
  exit 2
fi
if [ ${#specs[@]} -eq 0 ]; then specs=("[serving]~[timing]~[numerics]~[memory]"); fi
if ! command -v clang++ >/dev/null 2>&1; then
  echo "sanitize: clang++ not found (deploy/install-deps.sh installs clang); skipped" >&2
  exit 77
fi

started=$(date +%s)
source deploy/logged.sh
logged build/sanitize-configure.log "sanitize: configuring" cmake --preset fuzz
logged build/sanitize-build.log "sanitize: the build" cmake --build --preset fuzz -j "$(nproc)" \
  --target tophat-cloud tophat-agent tophat_serving_test
echo "sanitize: built in $(( $(date +%s) - started )) s (log: build/sanitize-build.log)"

reports="$(mktemp -d)"
trap 'rm -rf "$reports"' EXIT
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1:log_path=$reports/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan"
export TOPHAT_TOY_MODEL_DIR="$toy_model"
status=0
echo "sanitize: running ${specs[*]} (left out here: $(build/fuzz/tests/tophat_serving_test \
  --list-test-names-only '[timing],[numerics],[memory]' | grep -c . ) [timing], [numerics] and [memory] cases)"
# -w NoTests: a spec that matches nothing fails instead of passing with nothing run. Several
# specs are one Catch spec joined by commas (separate arguments would have to match at once).
build/fuzz/tests/tophat_serving_test -w NoTests "$(IFS=,; echo "${specs[*]}")" || status=$?
if [ -n "$(ls -A "$reports")" ]; then
  for report in "$reports"/*; do
    echo "sanitize: report from ${report##*/}:" >&2
    head -80 "$report" >&2
  done
  status=1
fi
echo "sanitize: $(( $(date +%s) - started )) s in all"
exit "$status"
