#include "models/runtime/compute_threads.h"

#include <ATen/Parallel.h>

#include <catch2/catch.hpp>

#include "kernels/gemv.h"

namespace tophat {
namespace {

TEST_CASE("SetComputeThreads caps LibTorch's and OpenBLAS's pools together", "[runtime]") {
  const int torch_before = at::get_num_threads();
  const int blas_before = BlasThreads();
  REQUIRE(SetComputeThreads(1).ok());
  CHECK(at::get_num_threads() == 1);
  // Debian's LibTorch runs on OpenBLAS when libopenblas0-pthread is installed (the build
  // requires it); with another BLAS there is no second pool to cap.
  if (blas_before != 0) CHECK(BlasThreads() == 1);
  CHECK_FALSE(SetComputeThreads(-2).ok());

  REQUIRE(SetComputeThreads(torch_before).ok());
  CHECK(at::get_num_threads() == torch_before);
}

TEST_CASE("SetComputeThreads sets the single-row kernel's threads, 0 one per core",
          "[runtime]") {
  const int torch_before = at::get_num_threads();
  REQUIRE(SetComputeThreads(1).ok());
  CHECK(kernels::SingleRowThreads() == 1);
  REQUIRE(SetComputeThreads(0).ok());
  CHECK(kernels::SingleRowThreads() == kernels::CoresForCompute());
  CHECK(at::get_num_threads() == 1);  // 0 leaves LibTorch's pool as it was
  REQUIRE(SetComputeThreads(torch_before).ok());
  REQUIRE(SetComputeThreads(0).ok());
}

}  // namespace
}  // namespace tophat
