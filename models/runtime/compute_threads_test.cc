#include "models/runtime/compute_threads.h"

#include <ATen/Parallel.h>

#include <catch2/catch.hpp>

#include "kernels/gemv.h"

namespace tophat {
namespace {

TEST_CASE("SetComputeThreads caps LibTorch's pool and the BLAS's together", "[runtime]") {
  const int torch_before = at::get_num_threads();
  REQUIRE(BlasThreads() > 0);  // MKL (x86-64 wheels) or OpenMP (aarch64): always readable
  REQUIRE(SetComputeThreads(1).ok());
  CHECK(at::get_num_threads() == 1);
  CHECK(BlasThreads() == 1);
  // The report LibTorch prints (torch.__config__.parallel_info()): OpenMP's pool and, on
  // x86-64, MKL's count both follow.
  const std::string info = at::get_parallel_info();
  INFO(info);
  CHECK(info.find("omp_get_max_threads() : 1") != std::string::npos);
#if defined(__x86_64__)
  // PyTorch's x86-64 LibTorch computes with MKL: a build that found another BLAS (a slow
  // reference one, say) fails here rather than passing without checking it.
  CHECK(info.find("mkl_get_max_threads() : 1") != std::string::npos);
#else
  if (info.find("mkl_get_max_threads()") != std::string::npos) {
    CHECK(info.find("mkl_get_max_threads() : 1") != std::string::npos);
  }
#endif
  CHECK_FALSE(SetComputeThreads(-2).ok());

  REQUIRE(SetComputeThreads(torch_before).ok());
  CHECK(at::get_num_threads() == torch_before);
  CHECK(BlasThreads() == torch_before);
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
