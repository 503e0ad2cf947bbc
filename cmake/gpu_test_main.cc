// The Catch2 main of the GPU test binaries (label `gpu`). Without a usable CUDA device every
// test case exits with code 77, which CTest reports as skipped (SKIP_RETURN_CODE), never as
// passed. TOPHAT_REQUIRE_GPU=1 (set by deploy/gpu/check.sh) turns a missing device into a
// failure, so a GPU machine whose build lost CUDA cannot pass by skipping.
// TOPHAT_GPU_TEST_REHEARSAL=1 runs the cases without a device: only for the serving cases,
// whose cloud then runs where TOPHAT_TEST_CLOUD_DEVICE says (check.sh --rehearse sets cpu),
// to show on a CPU machine that a GPU bundle's programs run from it.
#include <ATen/Context.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "cmake/catch_session.h"  // Catch2's implementation: cmake/catch_session.cc

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]).starts_with("--list")) listing = true;
  }
  const char* rehearsal = std::getenv("TOPHAT_GPU_TEST_REHEARSAL");
  const bool rehearsing = rehearsal != nullptr && std::string_view(rehearsal) == "1";
  if (!listing && !rehearsing && !(at::hasCUDA() && at::getNumGPUs() > 0)) {
    const char* require = std::getenv("TOPHAT_REQUIRE_GPU");
    if (require != nullptr && std::string_view(require) == "1") {
      std::fprintf(stderr, "TOPHAT_REQUIRE_GPU=1 but LibTorch sees no CUDA device "
                           "(hasCUDA=%d)\n", at::hasCUDA() ? 1 : 0);
      return 1;
    }
    std::fprintf(stderr, "skipped: no CUDA device (this build %s CUDA)\n",
                 at::hasCUDA() ? "has" : "has no");
    return 77;
  }
#ifdef TOPHAT_GPU_TEST_CLOUD_DEVICE
  // tophat_serving_cuda_test: the serving cases' cloud daemons run on this device.
  setenv("TOPHAT_TEST_CLOUD_DEVICE", TOPHAT_GPU_TEST_CLOUD_DEVICE, /*overwrite=*/0);
#endif
#ifdef TOPHAT_GPU_TEST_CLOUD_STAGES
  // tophat_serving_cuda_staged_test: and split into pipeline stages (serving_staged_main.cc).
  setenv("TOPHAT_TEST_CLOUD_STAGES", TOPHAT_GPU_TEST_CLOUD_STAGES, /*overwrite=*/0);
#endif
  return tophat::testing::RunCatchSession(argc, argv);
}
