#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, AddressSanitizer + UBSan, coverage
# in every library) and runs each for a bounded time: first over its crash reproducers
# (fuzz/regressions/<target>/, each must now run clean), then fuzzing from its seed corpus
# (fuzz/corpus/<target>/; new inputs go to a scratch copy, the tree is not touched).
# A crash leaves its input in build/fuzz/artifacts/ and fails the run.
#
#   bash deploy/fuzz.sh [--seconds N] [TARGET...]   explore: N s each (30), a random seed
#   bash deploy/fuzz.sh --replay [TARGET...]        the test suite's run: a fixed seed and a
#                                                   fixed number of inputs per target
#   --prebuilt                                      run the targets build/fuzz already holds
#                                                   (deploy/fuzz-tree.sh built them) instead of
#                                                   building them first
#
# --replay takes the luck out of the test suite's run as far as libFuzzer allows: the same
# seed and number of inputs whatever the machine's speed (stop 26's CI failed on an input no
# later run met). Not bit-for-bit: coverage seen through threads (LibTorch's pool) can differ
# between runs, and with it which inputs are kept and mutated further (agent_message: 1,581
# then 1,861 edges in two runs). Exploring finds new inputs; keep any crash it finds in
# fuzz/regressions/<target>/, which both modes replay first.
#
# Exits 77 (CTest's "skipped") when clang++ is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=30
replay=0
prebuilt=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --replay) replay=1; shift ;;
    --prebuilt) prebuilt=1; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  targets=(agent_message hidden_states safetensors model_config tokenizer_json yaml_config app_request
           openai_request json_grammar json_schema tool_calls harmony_calls ebnf_grammar
           structural_tag)
fi
if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: clang++ not found (deploy/install-deps.sh installs clang); skipped" >&2
  exit 77
fi

started=$(date +%s)
if [ "$prebuilt" = 1 ]; then
  for target in "${targets[@]}"; do
    [ -x "build/fuzz/fuzz/${target}_fuzzer" ] || {
      echo "fuzz: --prebuilt, but build/fuzz/fuzz/${target}_fuzzer is not built" \
           "(bash deploy/fuzz-tree.sh builds it)" >&2; exit 1; }
  done
else
  source deploy/logged.sh
  logged build/fuzz-configure.log "fuzz: configuring" cmake --preset fuzz
  logged build/fuzz-build.log "fuzz: the build" cmake --build --preset fuzz -j "$(nproc)"
  echo "fuzz: built in $(( $(date +%s) - started )) s (log: build/fuzz-build.log)"
fi

artifacts="build/fuzz/artifacts"
mkdir -p "$artifacts"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# Leaks are findings too; a UB report aborts (the preset's -fno-sanitize-recover).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# One target: its reproducers, then fuzzing; "clean" or the failure goes to its own report
# file, so that targets can run side by side.
fuzz_target() {
  local target="$1"
  local binary="build/fuzz/fuzz/${target}_fuzzer"
  local regressions="fuzz/regressions/${target}"
  local report="$scratch/$target.report"
  if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ]; then
    if ! "$binary" "$regressions"/* >"$scratch/$target-regressions.log" 2>&1; then
      { echo "fuzz: $target: a reproducer in $regressions fails again:"
        tail -40 "$scratch/$target-regressions.log"; } >"$report"
      return 1
    fi
  fi
  mkdir -p "$scratch/$target"
  # --replay: a fixed number of inputs per target, always the same ones (json_schema's, the
  # slowest, about a minute on an idle 2-core VM: each input also checks a mask over 317
  # tokens).
  local budget=(-max_total_time="$seconds")
  if [ "$replay" = 1 ]; then
    local -A runs_for=([agent_message]=1000 [hidden_states]=400000 [safetensors]=60000
                    [model_config]=60000 [tokenizer_json]=30000 [yaml_config]=3000
                    [app_request]=200000 [openai_request]=100000 [json_grammar]=150000
                    [json_schema]=100000 [tool_calls]=100000 [harmony_calls]=100000
                    [ebnf_grammar]=60000
                    [structural_tag]=100000)
    budget=(-seed=1 -runs="${runs_for[$target]:-10000}")
  fi
  local started_at
  started_at=$(date +%s)
  # -timeout: an input still running after this long is reported as a hang. 25 s, not less:
  # under CI the fuzzers share 2 cores with the toy model's training, and an ASan build runs
  # a slow but finite input (a large tensor, a deep YAML document) several times slower.
  if "$binary" "${budget[@]}" -timeout=25 -rss_limit_mb=3072 -print_final_stats=1 \
      -artifact_prefix="$artifacts/$target-" "$scratch/$target" "fuzz/corpus/$target" \
      >"$scratch/$target.log" 2>&1; then
    local runs cov
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$scratch/$target.log" | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o 'cov: [0-9]*' "$scratch/$target.log" | tail -1 | grep -o '[0-9]*' || echo "?")
    echo "fuzz: $target: clean, $runs inputs in $(( $(date +%s) - started_at )) s," \
         "coverage $cov edges$([ "$replay" = 1 ] && echo " (replay, seed 1)")" >"$report"
    return 0
  fi
  { echo "fuzz: $target: FOUND A CRASH (input kept in $artifacts/):"
    tail -60 "$scratch/$target.log"
    echo "fuzz: reproduce with $binary $artifacts/$target-<file>; once fixed, copy the input" \
         "into $regressions/ so that it stays fixed"; } >"$report"
  return 1
}

# Each fuzzer runs on one core for a fixed time: as many side by side as there are cores,
# so the time budget is spent once per core, not once per target.
declare -A pids=()
running=0
for target in "${targets[@]}"; do
  if [ "$running" -ge "$(nproc)" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  fuzz_target "$target" &
  pids[$target]=$!
  running=$((running + 1))
done
failed=()
for target in "${targets[@]}"; do
  if wait "${pids[$target]}"; then
    cat "$scratch/$target.report"
  else
    cat "$scratch/$target.report" >&2
    failed+=("$target")
  fi
done
echo "fuzz: $(( $(date +%s) - started )) s in all"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
