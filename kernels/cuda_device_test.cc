#include "kernels/cuda_device.h"

#include <catch2/catch.hpp>

namespace tophat::kernels {
namespace {

TEST_CASE("Overlapped kernel launches follow the setting, and are off where no GPU is") {
  struct Restore {
    ~Restore() { SetOverlapKernelLaunches(true); }
  } restore;
  SetOverlapKernelLaunches(false);
  CHECK_FALSE(OverlapKernelLaunches());
  SetOverlapKernelLaunches(true);
  // Without a reachable CUDA device (CI's machines, a CPU build) nothing launches at all,
  // so nothing may claim to launch overlapped; on a GPU the capability decides
  // (models/runtime/submodel_gpu_test.cc checks that side).
  if (!QueryCudaMemory(0).has_value()) CHECK_FALSE(OverlapKernelLaunches());
}

}  // namespace
}  // namespace tophat::kernels
