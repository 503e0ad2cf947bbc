#include "kernels/gemv_mxfp4.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "kernels/test_inputs.h"

namespace tophat::kernels {
namespace {

// A random MXFP4 matrix [n, k]: every code, and exponents around 127 (scales 2^-8 to 2^7),
// 0 and 255 among them once each where there is room.
Mxfp4Matrix RandomMxfp4(int64_t n, int64_t k) {
  const at::Tensor blocks = at::randint(0, 256, {n, k / 32, 16}, at::kByte);
  at::Tensor scales = at::randint(119, 135, {n, k / 32}, at::kByte);
  return {.blocks = blocks.contiguous(), .scales = scales.contiguous()};
}

// The kernels' shapes, each with its inputs: rows around the four-row blocks and the thread
// split; one block to many, an odd count among them (the AVX-512 integer kernel takes two at
// a time); x rows 1 (decode) to the kernel's most. `check` gets the weight, x, a bias, the
// dequantized weight and a tolerance: sums of up to 2880 products of values up to 6 * 2^7
// with x in [-1, 1], relative to the row's magnitude; a wrong code, order or scale is off
// by far more.
void ForEachKernelShape(
    const std::function<void(int64_t n, int64_t k, int64_t m, const Mxfp4Matrix& w,
                             const at::Tensor& x, const at::Tensor& b, const at::Tensor& dense,
                             double tolerance)>& check) {
  for (int64_t n : {1, 3, 4, 7, 300, 2880}) {
    for (int64_t k : {32, 64, 96, 2880}) {
      for (int64_t m : {int64_t{1}, int64_t{3}, kMxfp4KernelMaxRows}) {
        if (n * k * m > 20'000'000) continue;
        const Mxfp4Matrix w = RandomMxfp4(n, k);
        const at::Tensor x = testing::UniformInputs({m, k});
        const at::Tensor b = testing::UniformInputs({n});
        const at::Tensor dense = w.Dequantize();
        check(n, k, m, w, x, b, dense, 1e-5 * (1 + at::abs(dense).sum(1).max().item<double>()));
      }
    }
  }
}

TEST_CASE("MXFP4 dequantizes low nibble first, each block times 2^(s - 127)", "[kernels]") {
  // Row 0: codes 1 (0.5) and 15 (-6) in the first byte, 8 (-0) in the second's low nibble;
  // scale 2^1. Row 1: code 7 (6) at 2^-127 (a subnormal float) and at 2^127.
  at::Tensor blocks = at::zeros({2, 2, 16}, at::kByte);
  at::Tensor scales = at::full({2, 2}, 127, at::kByte);
  blocks[0][0][0] = 0xF1;
  blocks[0][0][1] = 0x08;
  scales[0][0] = 128;
  blocks[1][0][0] = 0x07;
  scales[1][0] = 0;
  blocks[1][1][0] = 0x07;
  scales[1][1] = 254;
  const at::Tensor dense = Mxfp4Matrix{.blocks = blocks, .scales = scales}.Dequantize();
  REQUIRE(dense.sizes() == at::IntArrayRef({2, 64}));
  CHECK(dense[0][0].item<float>() == 1.0f);
  CHECK(dense[0][1].item<float>() == -12.0f);
  CHECK(dense[0][2].item<float>() == 0.0f);
  CHECK(std::signbit(dense[0][2].item<float>()));
  CHECK(dense[1][0].item<float>() == std::ldexp(6.0f, -127));
  CHECK(dense[1][32].item<float>() == std::ldexp(6.0f, 127));
}

TEST_CASE(
    "The MXFP4 kernel matches LibTorch on the dequantized matrix, every instruction set, "
    "for one row and a few",
    "[kernels]") {
  at::manual_seed(5);
  ForEachKernelShape([](int64_t n, int64_t k, int64_t m, const Mxfp4Matrix& w, const at::Tensor& x,
                        const at::Tensor& b, const at::Tensor& dense, double tolerance) {
    const at::Tensor expected = at::linear(x, dense);
    for (CpuIsa isa : SupportedCpuIsas()) {
      INFO(CpuIsaName(isa) << " n=" << n << " k=" << k << " m=" << m);
      CHECK((LinearMxfp4WithIsa(isa, x, w) - expected).abs().max().item<double>() < tolerance);
      CHECK((LinearMxfp4WithIsa(isa, x, w, b) - (expected + b)).abs().max().item<double>() <
            tolerance);
    }
    // The dispatching entry point.
    CHECK((LinearMxfp4(x, w, b) - (expected + b)).abs().max().item<double>() < tolerance);
  });
  // Many rows through BLAS.
  const Mxfp4Matrix w = RandomMxfp4(70, 64);
  const at::Tensor x = testing::UniformInputs({40, 64});
  const at::Tensor expected = at::linear(x, w.Dequantize());
  CHECK((LinearMxfp4(x, w) - expected).abs().max().item<double>() < 1e-3);
  // bfloat16 x: BLAS in bfloat16, within its rounding of the float32 product.
  CHECK((LinearMxfp4(x.to(at::kBFloat16), w).to(at::kFloat) - expected).abs().max().item<double>() <
        2e-2 * (1 + expected.abs().max().item<double>()));
}

TEST_CASE(
    "The MXFP4 kernel with int8 activations matches LibTorch on the rounded x and the "
    "dequantized matrix, every instruction set, for one row and a few",
    "[kernels]") {
  at::manual_seed(6);
  ForEachKernelShape([](int64_t n, int64_t k, int64_t m, const Mxfp4Matrix& w, const at::Tensor& x,
                        const at::Tensor& b, const at::Tensor& dense, double tolerance) {
    // Each block's integer sum is exact; what differs is the order of the float sums of
    // blocks, as for the float kernel, so the same tolerance holds.
    const at::Tensor expected = at::linear(RoundActivationsInt8(x), dense);
    for (W8A8Isa isa : SupportedW8A8Isas()) {
      INFO(W8A8IsaName(isa) << " n=" << n << " k=" << k << " m=" << m);
      CHECK((LinearMxfp4A8WithIsa(isa, x, w) - expected).abs().max().item<double>() < tolerance);
      CHECK((LinearMxfp4A8WithIsa(isa, x, w, b) - (expected + b)).abs().max().item<double>() <
            tolerance);
    }
    CHECK((LinearMxfp4A8(x, w, b) - (expected + b)).abs().max().item<double>() < tolerance);
  });
}

TEST_CASE(
    "The MXFP4 kernel with int8 activations computes each row of x alike however many rows "
    "come with it, and many rows take the rounded x through BLAS",
    "[kernels]") {
  at::manual_seed(7);
  const Mxfp4Matrix w = RandomMxfp4(257, 2880);
  const at::Tensor x = at::randn({kMxfp4KernelMaxRows, 2880}) * 3;
  // A verification round's rows get exactly a decode step's numbers.
  const at::Tensor together = LinearMxfp4A8(x, w);
  for (int64_t i : {int64_t{0}, int64_t{5}, kMxfp4KernelMaxRows - 1}) {
    CHECK(at::equal(LinearMxfp4A8(x.narrow(0, i, 1), w)[0], together[i]));
  }
  // Rows with a stride (a view into a wider tensor) take the kernel as they are.
  const at::Tensor wide = at::cat({x, at::randn({kMxfp4KernelMaxRows, 100})}, 1);
  const at::Tensor view = wide.narrow(1, 0, 2880);
  REQUIRE(view.stride(0) == 2980);
  CHECK(at::equal(LinearMxfp4A8(view, w), together));
  // More rows than the kernel takes: the same products through BLAS.
  const at::Tensor dense = w.Dequantize();
  const at::Tensor many = at::randn({40, 2880});
  const at::Tensor expected = at::linear(RoundActivationsInt8(many), dense);
  CHECK((LinearMxfp4A8(many, w) - expected).abs().max().item<double>() <
        1e-5 * (1 + at::abs(dense).sum(1).max().item<double>()));
  // Against float32 activations the rounding costs little: each value moves by at most half a
  // step of its block's absmax / 127, which over a sum of 2,880 products keeps the outputs
  // within a percent of their scale.
  const at::Tensor exact = at::linear(x, dense);
  const float relative = ((together - exact).abs().max() / exact.abs().max()).item<float>();
  INFO("largest difference from float32 activations, relative to the largest output: " << relative);
  CHECK(relative < 0.01f);
}

}  // namespace
}  // namespace tophat::kernels
