#include "kernels/gemv.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#include <catch2/catch.hpp>

#include "kernels/test_inputs.h"

namespace tophat::kernels {
namespace {

TEST_CASE("Every instruction set this CPU runs is offered, plain C++ first", "[kernels]") {
  const std::vector<CpuIsa>& isas = SupportedCpuIsas();
  REQUIRE(!isas.empty());
  CHECK(isas.front() == CpuIsa::kScalar);
  CHECK(std::find(isas.begin(), isas.end(), SelectedCpuIsa()) != isas.end());
#if defined(__aarch64__)
  CHECK(std::find(isas.begin(), isas.end(), CpuIsa::kNeon) != isas.end());
#endif
  for (CpuIsa isa : isas) UNSCOPED_INFO("runs " << CpuIsaName(isa));
  UNSCOPED_INFO("selected " << CpuIsaName(SelectedCpuIsa()));
  SUCCEED();
}

// Cores counted another way than the code does: distinct (package, core id) pairs.
int CoresByCoreId() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  REQUIRE(sched_getaffinity(0, sizeof mask, &mask) == 0);
  std::set<std::pair<std::string, std::string>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::string package;
    std::string core;
    std::ifstream(dir + "physical_package_id") >> package;
    std::ifstream(dir + "core_id") >> core;
    if (package.empty() || core.empty()) return CPU_COUNT(&mask);
    cores.emplace(package, core);
  }
  return static_cast<int>(cores.size());
}

TEST_CASE("The single-row kernel uses one thread per core as Linux counts them", "[kernels]") {
  CHECK(CoresForCompute() == CoresByCoreId());
  CHECK(SingleRowThreads() == CoresForCompute());
  SetSingleRowThreads(1);
  CHECK(SingleRowThreads() == 1);
  SetSingleRowThreads(0);
  CHECK(SingleRowThreads() == CoresForCompute());
}

TEST_CASE("Single-row GEMV matches at::linear on random inputs, every instruction set",
          "[kernels]") {
  at::manual_seed(0);
  // Row counts around the four-row blocks and the thread split; widths around the vector
  // steps (8, 16, 32 floats) and the prefetch distance. Each shape's inputs and reference
  // are made once for every instruction set (they cost more than the kernels under the
  // aarch64 emulator).
  for (int64_t n : {1, 3, 4, 7, 300, 2305}) {
    for (int64_t k : {1, 13, 31, 64, 100, 768, 1030}) {
      const at::Tensor x = testing::UniformInputs({1, k});
      const at::Tensor w = testing::UniformInputs({n, k});
      const at::Tensor b = testing::UniformInputs({n});
      const at::Tensor expected = at::linear(x, w);
      const at::Tensor expected_with_bias = at::linear(x, w, b);
      for (CpuIsa isa : SupportedCpuIsas()) {
        INFO(CpuIsaName(isa) << " n=" << n << " k=" << k);
        CHECK(at::allclose(LinearSingleRowWithIsa(isa, x, w), expected, 1e-4, 1e-4));
        CHECK(at::allclose(LinearSingleRowWithIsa(isa, x, w, b), expected_with_bias, 1e-4,
                           1e-4));
      }
    }
  }
}

TEST_CASE("Single-row GEMV reads strided inputs in place, every instruction set",
          "[kernels]") {
  at::manual_seed(1);
  for (CpuIsa isa : SupportedCpuIsas()) {
    INFO(CpuIsaName(isa));
    // A weight that is a column slice of a wider matrix: rows contiguous, row stride > K.
    at::Tensor wide = at::randn({301, 900});
    at::Tensor w = wide.narrow(1, 7, 777);
    REQUIRE(w.stride(0) == 900);
    at::Tensor x = at::randn({1, 777});
    CHECK(at::allclose(LinearSingleRowWithIsa(isa, x, w), at::linear(x, w), 1e-4, 1e-4));
    // A strided input row (every other element of a longer one).
    at::Tensor xs = at::randn({1, 777 * 2}).slice(1, 0, 777 * 2, 2);
    REQUIRE(xs.stride(1) == 2);
    CHECK(at::allclose(LinearSingleRowWithIsa(isa, xs, w), at::linear(xs, w), 1e-4, 1e-4));
    // A row block of a bigger matrix (the fused QKV's K part, say).
    at::Tensor rows = wide.narrow(0, 100, 50);
    at::Tensor x900 = at::randn({1, 900});
    CHECK(at::allclose(LinearSingleRowWithIsa(isa, x900, rows), at::linear(x900, rows), 1e-4,
                       1e-4));
  }
}

TEST_CASE("Single-row GEMV falls back for other shapes and dtypes", "[kernels]") {
  at::Tensor x = at::randn({3, 16});
  at::Tensor w = at::randn({8, 16});
  CHECK(at::allclose(LinearSingleRow(x, w), at::linear(x, w)));
  at::Tensor xd = at::randn({1, 16}, at::kDouble);
  at::Tensor wd = at::randn({8, 16}, at::kDouble);
  CHECK(at::allclose(LinearSingleRow(xd, wd), at::linear(xd, wd)));
  at::Tensor strided = at::randn({16, 8}).t();  // column-major weight: rows not contiguous
  at::Tensor row = at::randn({1, 16});
  CHECK(at::allclose(LinearSingleRow(row, strided), at::linear(row, strided)));
}

TEST_CASE(
    "A few rows through the weight at once equal the single-row kernel row by row, bit "
    "for bit",
    "[kernels]") {
  at::manual_seed(2);
  // Widths whose 16 KiB blocks are four rows (768 and up) or more (64, 100), row counts
  // around the blocks and the thread split, with and without a bias, and a weight that is a
  // row block of a wider matrix.
  for (int64_t n : {4, 7, 300, 2305}) {
    for (int64_t k : {64, 100, 768, 1030}) {
      const at::Tensor wide = testing::UniformInputs({n, k + 5});
      const at::Tensor w = wide.narrow(1, 2, k);
      const at::Tensor b = testing::UniformInputs({n});
      for (int64_t rows = 2; rows <= kFewRowsMax; rows += 3) {
        INFO("n=" << n << " k=" << k << " rows=" << rows);
        const at::Tensor x = testing::UniformInputs({rows, k});
        for (const at::Tensor& bias : {at::Tensor(), b}) {
          at::Tensor out = at::empty({rows, n});
          REQUIRE(LinearFewRowsOut(x, w, bias, out));
          for (int64_t r = 0; r < rows; ++r) {
            at::Tensor single = at::empty({1, n});
            LinearSingleRowOut(x.narrow(0, r, 1), w, bias, single);
            CHECK(at::equal(out.narrow(0, r, 1), single));
          }
          const at::Tensor expected = bias.defined() ? at::linear(x, w, bias) : at::linear(x, w);
          CHECK(at::allclose(out, expected, 1e-4, 1e-4));
        }
      }
    }
  }
}

TEST_CASE("The few-rows kernel leaves what it does not take to the caller", "[kernels]") {
  const at::Tensor w = at::randn({8, 16});
  at::Tensor out = at::zeros({3, 8});
  // One row (the single-row kernel's), too many rows, another dtype, a strided input.
  at::Tensor one = at::zeros({1, 8});
  CHECK_FALSE(LinearFewRowsOut(at::randn({1, 16}), w, {}, one));
  at::Tensor many = at::zeros({kFewRowsMax + 1, 8});
  CHECK_FALSE(LinearFewRowsOut(at::randn({kFewRowsMax + 1, 16}), w, {}, many));
  CHECK_FALSE(LinearFewRowsOut(at::randn({3, 16}, at::kDouble), w.to(at::kDouble), {}, out));
  CHECK_FALSE(LinearFewRowsOut(at::randn({3, 32}).slice(1, 0, 32, 2), w, {}, out));
  CHECK(out.abs().sum().item<double>() == 0.0);
}

TEST_CASE("Huge-page copies hold the same values and outlive the source", "[kernels]") {
  at::Tensor huge;
  at::Tensor expected;
  {
    at::Tensor src = at::randn({1000, 777});
    expected = src.clone();
    huge = CopyToHugePages(src);
  }
  CHECK(at::equal(huge, expected));
  CHECK(reinterpret_cast<uintptr_t>(huge.data_ptr()) % (2u << 20) == 0);
}

}  // namespace
}  // namespace tophat::kernels
