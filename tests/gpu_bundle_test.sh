#!/usr/bin/env bash
# The GPU bundle rehearsed on this machine: deploy/gpu/pack.sh packs the build tree, and
# deploy/gpu/check.sh --rehearse unpacks it in a temporary folder apart from the build and runs
# what a CPU can of the GPU check: every program must find its libraries from the bundle and
# the Python environment's PyTorch alone, the GPU tests must load and report themselves
# skipped, one serving case of each serving binary runs with a CPU cloud, the benchmarks at a
# small size.
#   gpu_bundle_test.sh BUILD_DIR PYTHON
set -euo pipefail
build_dir="$1"; python="$2"
here="$(cd "$(dirname "$0")/.." && pwd)"
work=$(mktemp -d "${TMPDIR:-/tmp}/tophat-bundle-rehearsal.XXXXXX")
trap 'rm -rf "$work"' EXIT
bash "$here/deploy/gpu/pack.sh" --build-dir "$build_dir" --out "$work/tophat-gpu-bundle.tar.xz"
# Only what the bundle holds: the build tree's library paths are not on LD_LIBRARY_PATH, and
# the bundle's check.sh is the one that runs.
tar -C "$work" -xJf "$work/tophat-gpu-bundle.tar.xz" tophat-gpu-bundle/deploy/gpu/check.sh
PYTHON="$python" bash "$work/tophat-gpu-bundle/deploy/gpu/check.sh" --rehearse \
  --bundle "$work/tophat-gpu-bundle.tar.xz" --work "$work/check" --out "$work/out" --budget 1200
# The same-run comparison the check ends with: a row for each case the later benches rerun.
grep -A3 '^== same run:' "$work/out/summary.txt" |
  grep -E '^decode B=1 +[0-9.]+ +[0-9.]+% +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$' ||
  { echo "gpu_bundle_test: check.sh printed no same-run comparison for decode B=1" >&2; exit 1; }
