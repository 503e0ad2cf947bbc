#!/usr/bin/env bash
# Cross-builds tophat for aarch64 (deploy/arm64/toolchain.cmake: Debian's cross g++ and arm64
# packages) and runs the unit tests under qemu-aarch64 (user-mode emulation).
#
#   bash deploy/arm64/test.sh         the kernel and tokenizer unit tests (what CI runs)
#   bash deploy/arm64/test.sh --all   the agent, the SDK, the tophat CLI, the cloud and every
#                                     unit test (the whole tree; ~as long as a native build)
#
# The first run downloads ~27 MB of arm64 packages (deploy/arm64/sysroot.sh) and PyTorch's
# aarch64 wheel (~430 MB, deploy/arm64/torch.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

targets=(tophat_kernels_test tophat_tokenizers_test)
test_dirs=(kernels models/tokenizers)  # where CTest registers those binaries' cases
while [ $# -gt 0 ]; do
  case "$1" in
    --all) targets=(all); test_dirs=(.); shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "arm64/test.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

started=$(date +%s)
bash deploy/arm64/sysroot.sh
bash deploy/arm64/torch.sh
source deploy/logged.sh
logged build/arm64-configure.log "arm64: configuring" cmake --preset arm64
logged build/arm64-build.log "arm64: the build" cmake --build --preset arm64 -j "$(nproc)" \
  --target "${targets[@]}"
echo "arm64: built ${targets[*]} in $(( $(date +%s) - started )) s"
# The unit tests of the binaries built here (binaries not built are registered as NOT_BUILT,
# with no label). The first case of the kernel tests checks that NEON is the path offered.
# qemu-user emulates its `max` CPU, which has Armv8.2's dot products: the kernel tests then
# require the kernels that use them to be offered (and so tested), beside baseline NEON's.
for dir in "${test_dirs[@]}"; do
  TOPHAT_EXPECT_NEON_DOTPROD=1 ctest --test-dir "build/arm64/$dir" -L unit -j "$(nproc)" \
    --output-on-failure --no-tests=error
done
echo "arm64: done in $(( $(date +%s) - started )) s"
