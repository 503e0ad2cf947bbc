#!/usr/bin/env bash
# The one command for a GPU server: builds against PyTorch's CUDA LibTorch, runs the GPU
# tests (label `gpu`, which must run, not skip) and the GPU benchmark, and prints its tables.
#
#   bash deploy/gpu/check.sh [--debs DIR] [--out DIR] [--quick] [--no-bench]
#
# --debs DIR: the Debian packages from deploy/gpu/fetch-debs.sh (machines without apt).
# --out DIR:  where logs and the benchmark's JSON go (default build/gpu-check).
# --quick:    benchmark at fewer batch sizes and repetitions.
set -euo pipefail
cd "$(dirname "$0")/../.."

debs=()
out="build/gpu-check"
quick=0
run_bench=1
while [ $# -gt 0 ]; do
  case "$1" in
    --debs) debs=(--debs "$2"); shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    --no-bench) run_bench=0; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || {
  echo "check.sh: nvidia-smi found no GPU" >&2; exit 1; }
if ! bash deploy/gpu/build.sh "${debs[@]}" >"$out/build.log" 2>&1; then
  grep -E 'error|FAILED' "$out/build.log" | head -40
  echo "check.sh: build failed, see $out/build.log" >&2
  exit 1
fi
[ -n "${debs[*]}" ] && export TOPHAT_GPU_PREFIX="$PWD/build/gpu-prefix"
# shellcheck source=env.sh
source deploy/gpu/env.sh

# LibTorch's exported copies of libstdc++ code must come after the system's (see
# cmake/torch_includes.cmake): the first library tophat-cloud needs is libstdc++.
first_needed=$(readelf -d build/gpu/bin/tophat-cloud | awk '/NEEDED/ {print $5; exit}')
echo "first needed library of tophat-cloud: $first_needed"
case "$first_needed" in
  *libstdc++*) ;;
  *) echo "check.sh: WARNING: libstdc++ is not the first needed library; std::filesystem calls may crash" >&2 ;;
esac

echo "== GPU tests (ctest -L gpu) =="
set +e
TOPHAT_REQUIRE_GPU=1 ctest --test-dir build/gpu -L gpu --output-on-failure 2>&1 | tee "$out/gpu-tests.log"
status=${PIPESTATUS[0]}
set -e

if [ "$run_bench" -eq 1 ]; then
  # Llama-3-8B's shape with random bf16 weights, split m = 2, k = 1: a 29-layer middle.
  model="${TOPHAT_BENCH_MODEL:-build/gpu-check-model/llama3-8b}"
  echo "== GPU benchmark: engine decode and prefill, Llama-3-8B shape, bf16 =="
  python3 bench/random_checkpoint.py --out "$model" --preset llama3-8b --dtype bf16
  batches=(1 8 32 64 128)
  reps=30
  if [ "$quick" -eq 1 ]; then batches=(1 64); reps=10; fi
  build/gpu/bin/tophat-bench-engine --model "$model" -m 2 -k 1 --device cuda --dtype bfloat16 \
    --context 1024 --batch "${batches[@]}" --prefill-tokens 2048 --repetitions "$reps" \
    --json "$out/bench-engine-gpu.json" 2>&1 | tee "$out/bench-engine-gpu.log"
  echo "== the same layers in Hugging Face transformers (eager; static cache + torch.compile) =="
  python3 bench/hf_compare.py --model "$model" -m 2 -k 1 --context 1024 --batch 1 32 \
    --repetitions "$reps" --json "$out/hf-compare.json" 2>&1 | tee "$out/hf-compare.log" ||
    echo "check.sh: the transformers comparison failed (see $out/hf-compare.log)" >&2
fi
exit "$status"
