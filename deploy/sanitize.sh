#!/usr/bin/env bash
# The serving tests under AddressSanitizer + UBSan, or ThreadSanitizer. Builds tophat-cloud,
# tophat-agent and the serving test binary in the `fuzz` preset's tree (clang, ASan + UBSan:
# one sanitized build, shared with the fuzz targets) or, with --sanitizer thread, the `tsan`
# preset's (clang, TSan), then runs the serving cases against those sanitized daemons on a
# toy model that an ordinary build trained (training it under a sanitizer would add minutes
# and test nothing the serving cases do not).
#
#   bash deploy/sanitize.sh --toy-model DIR [--sanitizer address|thread] [--prebuilt]
#                           [--shard I/N] [CATCH_TEST_SPEC...]
#   bash deploy/sanitize.sh --sanitizer address|thread --build-only
#   bash deploy/sanitize.sh --sanitizer address|thread --unit [--prebuilt]
#
# --unit runs the tree's unit tests instead of the serving cases, with the same report
# checks: under ASan all of them (ctest -L unit; target tophat_unit_tests), less
# machine_bounds_test, which compares its instrumented reference loop with LibTorch's
# uninstrumented kernels and so measures the sanitizer; under TSan those of the binaries
# whose code runs threads (ctest -L threaded; target tophat_threaded_unit_tests: the agent,
# the engine and cloud service, the pipeline, the HTTP servers, device watching, the
# tokenizers, base): the rest are single-threaded, and building all of them under TSan took
# tsan_tree from 434 s to 864 s on 2 cores. Both trees build their unit tests (the ASan one
# through deploy/fuzz-tree.sh): the suite runs them in each (sanitized_unit, tsan_unit).
# Any of the specs runs. --prebuilt runs what the tree already holds (deploy/fuzz-tree.sh
# builds build/fuzz; --build-only builds either tree and runs nothing) instead of building
# it first. --shard I/N runs the I-th of N shares of the cases (runs of consecutive cases in
# Catch's order), so that N runs side by side cover each case once: the test suite runs two
# under ASan, one under TSan.
#
# Under TSan, gRPC's and protobuf's own synchronization is invisible (Debian built them
# without it): deploy/tsan-suppressions.txt says what that leaves out, and
# base/thread_sanitizer.h annotates the orderings gRPC gives tophat's own code.
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
sanitizer=address
prebuilt=0
build_only=0
unit=0
shard=1
shards=1
specs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --toy-model) toy_model="$2"; shift 2 ;;
    --sanitizer)
      case "$2" in
        address|thread) sanitizer="$2" ;;
        *) echo "sanitize: --sanitizer $2: expected address or thread" >&2; exit 2 ;;
      esac
      shift 2 ;;
    --prebuilt) prebuilt=1; shift ;;
    --build-only) build_only=1; shift ;;
    --unit) unit=1; shift ;;
    --shard)
      if ! [[ "$2" =~ ^([0-9]+)/([0-9]+)$ ]] || [ "${BASH_REMATCH[1]}" -lt 1 ] ||
         [ "${BASH_REMATCH[1]}" -gt "${BASH_REMATCH[2]}" ]; then
        echo "sanitize: --shard $2: expected I/N with 1 <= I <= N" >&2; exit 2
      fi
      shard=${BASH_REMATCH[1]}; shards=${BASH_REMATCH[2]}; shift 2 ;;
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
    *) specs+=("$1"); shift ;;
  esac
done
if [ "$build_only" = 1 ] && [ "$prebuilt" = 1 ]; then
  echo "sanitize: --build-only and --prebuilt exclude each other" >&2; exit 2
fi
if [ "$unit" = 1 ] && { [ "$build_only" = 1 ] || [ ${#specs[@]} -gt 0 ] || [ "$shards" != 1 ]; }; then
  echo "sanitize: --unit runs the whole unit suite: no --build-only, --shard or specs" >&2; exit 2
fi
if [ "$build_only" = 0 ] && [ "$unit" = 0 ] &&
   { [ -z "$toy_model" ] || [ ! -f "$toy_model/config.json" ]; }; then
  echo "sanitize: --toy-model DIR must name a trained toy model (tophat toy-model --out DIR)" >&2
  exit 2
fi
if [ ${#specs[@]} -eq 0 ]; then specs=("[serving]~[timing]~[numerics]~[memory]~[cli]"); fi
if ! command -v clang++ >/dev/null 2>&1; then
  echo "sanitize: clang++ not found (deploy/install-deps.sh installs clang); skipped" >&2
  exit 77
fi

started=$(date +%s)
# The build preset, its tree and the log names: the fuzz tree is ASan's.
preset=fuzz
logs=sanitize
if [ "$sanitizer" = thread ]; then preset=tsan; logs=tsan; fi
binary=build/$preset/tests/tophat_serving_test
targets=(tophat-cloud tophat-agent tophat_serving_test)
unit_label=unit
if [ "$sanitizer" = thread ]; then unit_label=threaded; targets+=(tophat_threaded_unit_tests)
else targets+=(tophat_unit_tests); fi
needed=("$binary" build/$preset/bin/tophat-cloud build/$preset/bin/tophat-agent)
if [ "$unit" = 1 ]; then needed=(build/$preset/device_agent/tophat_speculative_decoder_test); fi
if [ "$prebuilt" = 1 ]; then
  for f in "${needed[@]}"; do
    [ -x "$f" ] || { echo "sanitize: --prebuilt, but $f is not built" \
                          "(without --prebuilt this script builds it)" >&2; exit 1; }
  done
else
  source deploy/logged.sh
  logged build/$logs-configure.log "sanitize: configuring" cmake --preset $preset
  logged build/$logs-build.log "sanitize: the build" cmake --build --preset $preset \
    -j "$(nproc)" --target "${targets[@]}"
  echo "sanitize: built in $(( $(date +%s) - started )) s (log: build/$logs-build.log)"
fi
if [ "$build_only" = 1 ]; then exit 0; fi

reports="$(mktemp -d)"
trap 'rm -rf "$reports"' EXIT
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1:log_path=$reports/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan"
# Leaks Debian's libraries keep for the process's life (deploy/lsan-suppressions.txt says which).
export LSAN_OPTIONS="suppressions=$PWD/deploy/lsan-suppressions.txt:print_suppressions=0"
# Every report, not only the first of each process (halt_on_error=0): a run names all it
# found. ignore_noninstrumented_modules: the memory functions Debian's uninstrumented
# libraries call (gRPC's, OpenMP's) are theirs, not tophat's.
export TSAN_OPTIONS="halt_on_error=0:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$PWD/deploy/tsan-suppressions.txt:log_path=$reports/tsan"
export TOPHAT_TOY_MODEL_DIR="$toy_model"
status=0
if [ "$unit" = 1 ]; then
  echo "sanitize: running the unit tests labelled $unit_label in build/$preset" \
       "(left out: machine_bounds_test)"
  ctest --test-dir "build/$preset" -L "$unit_label" \
    -E '^tophat_model_bench_test/machine_bounds_test$' \
    -j "$(nproc)" --output-on-failure --no-tests=error || status=$?
else
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
