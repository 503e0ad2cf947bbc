#include "kernels/gemv_w8a8.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "kernels/test_inputs.h"

namespace tophat::kernels {
namespace {

// The reference: LibTorch's float32 product of x as rounded with the dequantized matrix.
at::Tensor Reference(const at::Tensor& x, const Int8Matrix& w, const at::Tensor& bias = {}) {
  const at::Tensor rounded = RoundActivationsInt8(x);
  return bias.defined() ? at::linear(rounded, w.Dequantize(), bias)
                        : at::linear(rounded, w.Dequantize());
}

TEST_CASE("The integer kernels this CPU runs are offered, plain loops first", "[kernels]") {
  const std::vector<W8A8Isa>& isas = SupportedW8A8Isas();
  REQUIRE(!isas.empty());
  CHECK(isas.front() == W8A8Isa::kScalar);
  for (W8A8Isa isa : isas) UNSCOPED_INFO("runs " << W8A8IsaName(isa));
#if defined(__aarch64__)
  CHECK(std::find(isas.begin(), isas.end(), W8A8Isa::kNeon) != isas.end());
  // deploy/arm64/test.sh sets this: qemu's `max` CPU has the dot-product instructions, so
  // the kernels that use them are among those every test below runs.
  if (std::getenv("TOPHAT_EXPECT_NEON_DOTPROD") != nullptr) {
    CHECK(isas.back() == W8A8Isa::kNeonDot);
  }
#endif
  SUCCEED();
}

TEST_CASE("Activations round to int8 per block of 32, within half a step of each value",
          "[kernels]") {
  at::manual_seed(11);
  at::Tensor x = at::randn({3, 100});  // three full blocks and a last one of 4
  x[1].narrow(0, 32, 32).zero_();      // a block of zeros stays zeros
  x[2][70] = 40.0f;                    // an outlier coarsens its own block only
  const at::Tensor rounded = RoundActivationsInt8(x);
  REQUIRE(rounded.sizes() == x.sizes());
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t begin = 0; begin < 100; begin += kActivationBlock) {
      const int64_t n = std::min<int64_t>(kActivationBlock, 100 - begin);
      const at::Tensor block = x[i].narrow(0, begin, n);
      const float step = block.abs().max().item<float>() / 127.0f;
      const at::Tensor error = (rounded[i].narrow(0, begin, n) - block).abs();
      INFO("row " << i << " block at " << begin);
      CHECK(error.max().item<float>() <= step / 2 + 1e-6f);
    }
  }
  CHECK(at::equal(rounded[1].narrow(0, 32, 32), x[1].narrow(0, 32, 32)));
  // The outlier's block has a step of 40/127; the block before it keeps its fine one.
  CHECK((rounded[2].narrow(0, 32, 32) - x[2].narrow(0, 32, 32)).abs().max().item<float>() <
        0.05f);
  // A value that is not finite makes its block NaN (as float arithmetic would), not a number.
  at::Tensor bad = at::randn({1, 64});
  bad[0][3] = std::numeric_limits<float>::infinity();
  const at::Tensor rounded_bad = RoundActivationsInt8(bad);
  CHECK(at::isnan(rounded_bad[0].narrow(0, 0, 32)).all().item<bool>());
  CHECK(at::isfinite(rounded_bad[0].narrow(0, 32, 32)).all().item<bool>());
}

TEST_CASE("Every instruction set rounds activations to the same bytes and scales", "[kernels]") {
  at::manual_seed(12);
  const int64_t k = 32 * 40 + 7;  // forty whole blocks and a short one
  at::Tensor x = at::randn({k}) * 3.0f;
  float* v = x.data_ptr<float>();
  // Ties: a block whose maximum is 127 scales by one, so its halves round to even.
  for (int64_t j = 0; j < 32; ++j) v[j] = static_cast<float>(j) - 15.5f;
  v[31] = 127.0f;
  for (int64_t j = 32; j < 64; ++j) v[j] = 0.0f;       // zeros
  v[64 + 5] = std::numeric_limits<float>::infinity();  // not finite
  v[96 + 9] = std::numeric_limits<float>::quiet_NaN();
  v[128 + 3] = -std::numeric_limits<float>::max();  // finite, largest
  for (int64_t j = 160; j < 192; ++j) v[j] = 1e-30f * static_cast<float>(j % 7 - 3);  // tiny
  v[224] = -0.0f;
  const int64_t blocks = (k + kActivationBlock - 1) / kActivationBlock;
  std::vector<int8_t> expected_q(static_cast<size_t>(k));
  std::vector<float> expected_scale(static_cast<size_t>(blocks));
  RoundActivationRowWithIsa(W8A8Isa::kScalar, v, k, expected_q.data(), expected_scale.data());
  CHECK(expected_q[16] == 0);   // 0.5 to even
  CHECK(expected_q[17] == 2);   // 1.5 to even
  CHECK(expected_q[18] == 2);   // 2.5 to even
  CHECK(expected_q[0] == -16);  // -15.5 to even
  for (W8A8Isa isa : SupportedW8A8Isas()) {
    std::vector<int8_t> q(static_cast<size_t>(k), 99);
    std::vector<float> scale(static_cast<size_t>(blocks), -1.0f);
    RoundActivationRowWithIsa(isa, v, k, q.data(), scale.data());
    INFO(W8A8IsaName(isa));
    CHECK(q == expected_q);
    for (int64_t b = 0; b < blocks; ++b) {
      INFO("block " << b);
      const float got = scale[static_cast<size_t>(b)];
      const float want = expected_scale[static_cast<size_t>(b)];
      CHECK(((std::isnan(got) && std::isnan(want)) || got == want));
    }
  }
}

TEST_CASE("The int8-activation kernel matches LibTorch on the rounded x and the dequantized "
          "matrix, every instruction set, for one row and a few",
          "[kernels]") {
  at::manual_seed(12);
  // Rows around the four-row blocks and the thread split; widths around the 32- and
  // 64-value steps (a tail of a whole block, of part of one) and the prefetch distance.
  // Each shape's inputs and reference are made once for every instruction set: under the
  // aarch64 emulator they cost more than the kernels.
  for (int64_t n : {1, 3, 4, 7, 300, 2305}) {
    for (int64_t k : {1, 13, 32, 64, 96, 100, 768, 2100}) {
      for (int64_t m : {int64_t{1}, int64_t{3}, kInt8KernelMaxRows}) {
        if (n * k * m > 20'000'000) continue;  // quick under the aarch64 emulator
        const Int8Matrix w = QuantizeInt8PerRow(testing::UniformInputs({n, k}));
        const at::Tensor x = testing::UniformInputs({m, k});
        const at::Tensor b = testing::UniformInputs({n});
        const at::Tensor expected = Reference(x, w);
        const at::Tensor expected_with_bias = expected + b;
        for (W8A8Isa isa : SupportedW8A8Isas()) {
          INFO(W8A8IsaName(isa) << " n=" << n << " k=" << k << " m=" << m);
          // Integer block sums are exact; what differs from BLAS is the order of the float
          // sums of blocks (k / 32 of them): an absolute 1e-3 on results of magnitude
          // ~sqrt(k). A wrong sign, block scale or row scale is off by far more.
          CHECK(at::allclose(LinearW8A8WithIsa(isa, x, w), expected, 1e-4, 1e-3));
          CHECK(at::allclose(LinearW8A8WithIsa(isa, x, w, b), expected_with_bias, 1e-4, 1e-3));
        }
      }
    }
  }
}

TEST_CASE("The int8-activation kernel computes each row of x alike however many rows come "
          "with it, and many rows take the rounded x through BLAS",
          "[kernels]") {
  at::manual_seed(13);
  const Int8Matrix w = QuantizeInt8PerRow(at::randn({257, 768}));
  const at::Tensor x = at::randn({kInt8KernelMaxRows, 768}) * 3;
  // A verification round's rows get exactly a decode step's numbers.
  const at::Tensor together = LinearW8A8(x, w);
  for (int64_t i : {int64_t{0}, int64_t{5}, kInt8KernelMaxRows - 1}) {
    CHECK(at::equal(LinearW8A8(x.narrow(0, i, 1), w)[0], together[i]));
  }
  // Rows with a stride (a view into a wider tensor) take the kernel as they are.
  const at::Tensor wide = at::cat({x, at::randn({kInt8KernelMaxRows, 100})}, 1);
  const at::Tensor view = wide.narrow(1, 0, 768);
  REQUIRE(view.stride(0) == 868);
  CHECK(at::equal(LinearW8A8(view, w), together));
  // More rows than the kernel takes: the same math through BLAS.
  const at::Tensor many = at::randn({40, 768});
  CHECK(at::allclose(LinearW8A8(many, w), Reference(many, w), 1e-4, 1e-3));
  // Against float32 activations the rounding costs little: within a percent of the scale
  // of the outputs.
  const at::Tensor exact = at::linear(x, w.Dequantize());
  CHECK(((together - exact).abs().max() / exact.abs().max()).item<float>() < 0.01f);
}

}  // namespace
}  // namespace tophat::kernels
