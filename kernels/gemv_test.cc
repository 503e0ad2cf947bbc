#include "kernels/gemv.h"

#include <catch2/catch.hpp>

namespace tophat::kernels {
namespace {

TEST_CASE("Single-row GEMV matches at::linear on random inputs", "[kernels]") {
  at::manual_seed(0);
  for (int64_t n : {1, 7, 300, 2304}) {
    for (int64_t k : {1, 13, 64, 100, 768}) {
      at::Tensor x = at::randn({1, k});
      at::Tensor w = at::randn({n, k});
      at::Tensor b = at::randn({n});
      INFO("n=" << n << " k=" << k);
      CHECK(at::allclose(LinearSingleRow(x, w), at::linear(x, w), 1e-4, 1e-4));
      CHECK(at::allclose(LinearSingleRow(x, w, b), at::linear(x, w, b), 1e-4, 1e-4));
    }
  }
}

TEST_CASE("Single-row GEMV falls back for other shapes and dtypes", "[kernels]") {
  at::Tensor x = at::randn({3, 16});
  at::Tensor w = at::randn({8, 16});
  CHECK(at::allclose(LinearSingleRow(x, w), at::linear(x, w)));
  at::Tensor xd = at::randn({1, 16}, at::kDouble);
  at::Tensor wd = at::randn({8, 16}, at::kDouble);
  CHECK(at::allclose(LinearSingleRow(xd, wd), at::linear(xd, wd)));
  at::Tensor strided = at::randn({16, 8}).t();  // non-contiguous weight
  at::Tensor row = at::randn({1, 16});
  CHECK(at::allclose(LinearSingleRow(row, strided), at::linear(row, strided)));
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
