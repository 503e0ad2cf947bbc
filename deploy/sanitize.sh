#!/usr/bin/env bash
# The serving tests under AddressSanitizer + UBSan. Builds tophat-cloud, tophat-agent and
# the serving test binary in the `fuzz` preset's tree (clang, ASan + UBSan: one
# sanitized build, shared with the fuzz targets), then runs the serving cases against those
# sanitized daemons on a toy model that an ordinary build trained (training it under ASan
# would add minutes and test nothing the serving cases do not).
#
#   bash deploy/sanitize.sh --toy-model DIR [--prebuilt] [--shard I/N] [CATCH_TEST_SPEC...]
#
# Any of the specs runs. --prebuilt runs what build/fuzz already holds (deploy/fuzz-tree.sh
# built it) instead of building it first. --shard I/N runs the I-th of N shares of the cases
# (runs of consecutive cases in Catch's order), so that N runs side by side cover each case
# once: the test suite runs two.
#
# The default spec is "[serving]~[timing]~[numerics]~[memory]~[cli]": the [timing] cases
# estimate link and compute rates from real transfers and need release-speed daemons, the
# [numerics] case gathers agreement statistics over 100 prompts through code paths shorter
# cases cover, the [memory] case measures resident memory, which under ASan is its
# allocator's and its quarantine's, and the [cli] cases run the `tophat` command line, which
# this tree does not build (all four run in the release suite).
#
# Every process writes its sanitizer reports to a scratch directory; any report fails the
# run, even one from a daemon the test had already finished with. Exits 77 (CTest's
# "skipped") when clang++ is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

toy_model=""
prebuilt=0
shard=1
shards=1
specs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --toy-model) toy_model="$2"; shift 2 ;;
    --prebuilt) prebuilt=1; shift ;;
    --shard)
      if ! [[ "$2" =~ ^([0-9]+)/([0-9]+)$ ]] || [ "${BASH_REMATCH[1]}" -lt 1 ] ||
         [ "${BASH_REMATCH[1]}" -gt "${BASH_REMATCH[2]}" ]; then
        echo "sanitize: --shard $2: expected I/N with 1 <= I <= N" >&2; exit 2
      fi
      shard=${BASH_REMATCH[1]}; shards=${BASH_REMATCH[2]}; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) specs+=("$1"); shift ;;
  esac
done
if [ -z "$toy_model" ] || [ ! -f "$toy_model/config.json" ]; then
  echo "sanitize: --toy-model DIR must name a trained toy model (tophat toy-model --out DIR)" >&2
  exit 2
fi
if [ ${#specs[@]} -eq 0 ]; then specs=("[serving]~[timing]~[numerics]~[memory]~[cli]"); fi
if ! command -v clang++ >/dev/null 2>&1; then
  echo "sanitize: clang++ not found (deploy/install-deps.sh installs clang); skipped" >&2
  exit 77
fi

started=$(date +%s)
binary=build/fuzz/tests/tophat_serving_test
if [ "$prebuilt" = 1 ]; then
  for f in "$binary" build/fuzz/bin/tophat-cloud build/fuzz/bin/tophat-agent; do
    [ -x "$f" ] || { echo "sanitize: --prebuilt, but $f is not built" \
                          "(bash deploy/fuzz-tree.sh builds it)" >&2; exit 1; }
  done
else
  source deploy/logged.sh
  logged build/sanitize-configure.log "sanitize: configuring" cmake --preset fuzz
  logged build/sanitize-build.log "sanitize: the build" cmake --build --preset fuzz -j "$(nproc)" \
    --target tophat-cloud tophat-agent tophat_serving_test
  echo "sanitize: built in $(( $(date +%s) - started )) s (log: build/sanitize-build.log)"
fi

reports="$(mktemp -d)"
trap 'rm -rf "$reports"' EXIT
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1:log_path=$reports/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan"
export TOPHAT_TOY_MODEL_DIR="$toy_model"
status=0
spec="$(IFS=,; echo "${specs[*]}")"
# The names of the cases a spec matches, one a line (Catch's exit status is their count).
list_cases() { "$binary" --list-test-names-only "$@" | grep . || true; }
left_out=$(list_cases '[timing],[numerics],[memory],[cli]' | wc -l)
if [ "$shards" = 1 ]; then
  echo "sanitize: running ${specs[*]} (left out here: $left_out [timing], [numerics]," \
       "[memory] and [cli] cases)"
  # -w NoTests: a spec that matches nothing fails instead of passing with nothing run.
  # Several specs are one Catch spec joined by commas (separate arguments would have to match
  # at once).
  "$binary" -w NoTests "$spec" || status=$?
else
  # This share's cases by name, one a line for Catch's --input-file, with the characters its
  # test specs give a meaning (a comma separates specs even inside the quotes it adds)
  # escaped: the share-th of `shards` runs of consecutive cases in Catch's order.
  all="$reports/all-cases"
  names="$reports/share-cases"
  list_cases "$spec" >"$all"
  awk -v i="$shard" -v n="$shards" -v total="$(wc -l <"$all")" \
    'NR > int((i - 1) * total / n) && NR <= int(i * total / n)' "$all" |
    sed -e 's/[][\\,*~"]/\\&/g' >"$names"
  count=$(wc -l <"$names")
  echo "sanitize: running share $shard of $shards of ${specs[*]}: $count of $(wc -l <"$all")" \
       "cases (left out here: $left_out [timing], [numerics], [memory] and [cli] cases)"
  # An empty list would be no spec at all, which runs every case; and every name must match
  # its case, or a case would be left out unseen.
  matched=$(list_cases -f "$names" | wc -l)
  if [ "$count" = 0 ] || [ "$matched" != "$count" ]; then
    echo "sanitize: share $shard of $shards names $count cases and matches $matched" >&2
    exit 1
  fi
  "$binary" -w NoTests -f "$names" || status=$?
  rm -f "$all" "$names"
fi
if [ -n "$(ls -A "$reports")" ]; then
  for report in "$reports"/*; do
    echo "sanitize: report from ${report##*/}:" >&2
    head -80 "$report" >&2
  done
  status=1
fi
echo "sanitize: $(( $(date +%s) - started )) s in all"
exit "$status"
