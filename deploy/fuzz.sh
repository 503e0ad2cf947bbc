#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, AddressSanitizer + UBSan, coverage
# in every library) and runs each for a bounded time: first over its crash reproducers
# (fuzz/regressions/<target>/, each must now run clean), then fuzzing from its seed corpus
# (fuzz/corpus/<target>/; new inputs go to a scratch copy, the tree is not touched).
# A crash leaves its input in build/fuzz/artifacts/ and fails the run.
#
#   bash deploy/fuzz.sh [--seconds N] [TARGET...]     (default: 30 s each, every target)
#
# Exits 77 (CTest's "skipped") when clang++ is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=30
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  targets=(agent_message hidden_states safetensors model_config tokenizer_json yaml_config app_request)
fi
if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: clang++ not found (deploy/install-deps.sh installs clang); skipped" >&2
  exit 77
fi

started=$(date +%s)
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)"
echo "fuzz: built in $(( $(date +%s) - started )) s"

artifacts="build/fuzz/artifacts"
mkdir -p "$artifacts"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# Leaks are findings too; a UB report aborts (the preset's -fno-sanitize-recover).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
for target in "${targets[@]}"; do
  binary="build/fuzz/fuzz/${target}_fuzzer"
  regressions="fuzz/regressions/${target}"
  if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ]; then
    if ! "$binary" "$regressions"/* >"$scratch/$target-regressions.log" 2>&1; then
      echo "fuzz: $target: a reproducer in $regressions fails again:" >&2
      tail -40 "$scratch/$target-regressions.log" >&2
      failed+=("$target")
      continue
    fi
  fi
  mkdir -p "$scratch/$target"
  if "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=3072 -print_final_stats=1 \
      -artifact_prefix="$artifacts/$target-" "$scratch/$target" "fuzz/corpus/$target" \
      >"$scratch/$target.log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$scratch/$target.log" | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o 'cov: [0-9]*' "$scratch/$target.log" | tail -1 | grep -o '[0-9]*' || echo "?")
    echo "fuzz: $target: clean, $runs inputs in ${seconds} s, coverage $cov edges"
  else
    echo "fuzz: $target: FOUND A CRASH (input kept in $artifacts/):" >&2
    tail -60 "$scratch/$target.log" >&2
    echo "fuzz: reproduce with $binary $artifacts/$target-<file>; once fixed, copy the input" \
         "into $regressions/ so that it stays fixed" >&2
    failed+=("$target")
  fi
done
echo "fuzz: $(( $(date +%s) - started )) s in all"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
