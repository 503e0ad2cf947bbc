#include "kernels/gemm_f32.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <functional>

#include "kernels/gemv_int8.h"
#include "kernels/test_inputs.h"

namespace tophat::kernels {
namespace {

bool CpuHasAvx512() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

at::Tensor Prompt(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {},
                  const at::Tensor& row_scale = {}) {
  at::Tensor out = at::empty({x.size(0), w.size(0)});
  REQUIRE(LinearF32PromptOut(x, w, bias, out, row_scale));
  return out;
}

TEST_CASE(
    "The float32 prompt kernel matches LibTorch for float32 and bfloat16 weights, for "
    "rows around its panels, tiles and chunks",
    "[kernels]") {
  if (!CpuHasAvx512()) {
    at::Tensor out = at::empty({2, 2});
    CHECK_FALSE(LinearF32PromptOut(at::ones({2, 2}), at::ones({2, 2}), {}, out));
    WARN("this CPU has no AVX-512F: the float32 prompt kernel is not offered, nothing to test");
    return;
  }
  at::manual_seed(31);
  // Weight rows around the 48-row panels; widths around the 128-column chunks; x rows around
  // the 8-row tiles.
  for (int64_t n : {1, 17, 47, 48, 49, 100, 769}) {
    for (int64_t k : {1, 31, 128, 129, 300, 1024}) {
      const at::Tensor w = testing::UniformInputs({n, k});
      const at::Tensor wb = w.to(at::kBFloat16);
      const at::Tensor b = testing::UniformInputs({n});
      for (int64_t m : {1, 7, 8, 9, 33, 70}) {
        const at::Tensor x = testing::UniformInputs({m, k});
        INFO("n=" << n << " k=" << k << " m=" << m);
        // Sums of k products of values in [-1, 1]: float32's rounding in another order than
        // BLAS's stays far under 1e-4 * sqrt(k); a wrong column or row is off by ~1.
        const double tolerance = 1e-5 * (1 + std::sqrt(static_cast<double>(k)));
        const at::Tensor expected =
            at::linear(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble));
        CHECK((Prompt(x, w, b).to(at::kDouble) - expected).abs().max().item<double>() < tolerance);
        const at::Tensor expected_bf16 = at::linear(x.to(at::kDouble), wb.to(at::kDouble));
        CHECK((Prompt(x, wb).to(at::kDouble) - expected_bf16).abs().max().item<double>() <
              tolerance);
        // int8 with a scale a row: the product with Int8Matrix::Dequantize's matrix.
        const Int8Matrix w8 = QuantizeInt8PerRow(w);
        const at::Tensor expected_int8 =
            at::linear(x.to(at::kDouble), w8.Dequantize().to(at::kDouble), b.to(at::kDouble));
        CHECK((Prompt(x, w8.values, b, w8.scale).to(at::kDouble) - expected_int8)
                  .abs()
                  .max()
                  .item<double>() < tolerance);
      }
    }
  }
}

TEST_CASE(
    "The float32 prompt kernel computes each row alike whatever rows come with it, reads "
    "strided rows, and takes only what it can",
    "[kernels]") {
  if (!CpuHasAvx512()) {
    WARN("this CPU has no AVX-512F: the float32 prompt kernel is not offered, nothing to test");
    return;
  }
  at::manual_seed(32);
  const at::Tensor w = at::randn({300, 700});
  const at::Tensor x = at::randn({45, 700});
  const at::Tensor all = Prompt(x, w);
  // Rows 5..44 alone (other tiles, other remainders): the same bits.
  CHECK(at::equal(Prompt(x.narrow(0, 5, 40), w), all.narrow(0, 5, 40)));
  CHECK(at::equal(Prompt(x.narrow(0, 44, 1), w), all.narrow(0, 44, 1)));
  // A view into a wider tensor: rows with a stride, read in place.
  const at::Tensor wide = at::cat({x, at::randn({45, 20})}, 1);
  const at::Tensor view = wide.narrow(1, 0, 700);
  REQUIRE(view.stride(0) == 720);
  CHECK(at::equal(Prompt(view, w), all));
  // Inputs it does not take: nothing written, false.
  at::Tensor out = at::empty({45, 300});
  CHECK_FALSE(LinearF32PromptOut(x.to(at::kDouble), w, {}, out));
  CHECK_FALSE(LinearF32PromptOut(x, w.to(at::kHalf), {}, out));
  CHECK_FALSE(LinearF32PromptOut(x, w.narrow(1, 0, 600), {}, out));
  CHECK_FALSE(LinearF32PromptOut(x.t().contiguous().t(), w, {}, out));
  CHECK_FALSE(LinearF32PromptOut(x, w.to(at::kChar), {}, out));  // int8 needs its row scales
}

at::Tensor Bf16Prompt(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {}) {
  at::Tensor out = at::empty({x.size(0), w.size(0)});
  REQUIRE(LinearBf16PromptOut(x, w, bias, out));
  return out;
}

TEST_CASE(
    "The bfloat16 prompt kernel is the rounded rows times the bfloat16 matrix, for rows "
    "around its panels, tiles, chunks and pairs",
    "[kernels]") {
  if (!Bf16PromptKernelAvailable()) {
    at::Tensor out = at::empty({2, 2});
    CHECK_FALSE(LinearBf16PromptOut(at::ones({2, 2}), at::ones({2, 2}, at::kBFloat16), {}, out));
    WARN(
        "this CPU has no AVX512_BF16: the bfloat16 prompt kernel is not offered, nothing to "
        "test");
    return;
  }
  at::manual_seed(33);
  // Odd widths leave a pair half empty.
  for (int64_t n : {1, 17, 48, 49, 769}) {
    for (int64_t k : {1, 2, 31, 128, 129, 300, 1023}) {
      const at::Tensor w = testing::UniformInputs({n, k}).to(at::kBFloat16);
      const at::Tensor b = testing::UniformInputs({n});
      for (int64_t m : {1, 8, 9, 33, 70}) {
        const at::Tensor x = testing::UniformInputs({m, k});
        INFO("n=" << n << " k=" << k << " m=" << m);
        // Each product of two bfloat16 values is exact in float32; the sums are float32's.
        const double tolerance = 1e-5 * (1 + std::sqrt(static_cast<double>(k)));
        const at::Tensor rounded = x.to(at::kBFloat16).to(at::kDouble);
        const at::Tensor expected = at::linear(rounded, w.to(at::kDouble), b.to(at::kDouble));
        const double error =
            (Bf16Prompt(x, w, b).to(at::kDouble) - expected).abs().max().item<double>();
        CHECK(error < tolerance);
        // Against the unrounded rows it is off by bfloat16's rounding (2^-9 a value), which a
        // wrong rounding (truncation, or none) would change.
        if (k >= 128) {
          const at::Tensor unrounded =
              at::linear(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble));
          CHECK((expected - unrounded).abs().max().item<double>() > 10 * tolerance);
        }
      }
    }
  }
  // A row's result whatever rows come with it; strided rows read in place; other inputs left.
  const at::Tensor w = at::randn({300, 700}).to(at::kBFloat16);
  const at::Tensor x = at::randn({45, 700});
  const at::Tensor all = Bf16Prompt(x, w);
  CHECK(at::equal(Bf16Prompt(x.narrow(0, 5, 40), w), all.narrow(0, 5, 40)));
  const at::Tensor wide = at::cat({x, at::randn({45, 20})}, 1);
  CHECK(at::equal(Bf16Prompt(wide.narrow(1, 0, 700), w), all));
  at::Tensor out = at::empty({45, 300});
  CHECK_FALSE(LinearBf16PromptOut(x, w.to(at::kFloat), {}, out));
  CHECK_FALSE(LinearBf16PromptOut(x.to(at::kDouble), w, {}, out));
  CHECK_FALSE(LinearBf16PromptOut(x, w.narrow(1, 0, 600), {}, out));
}

// Against BLAS (`at::mm`, MKL on x86) on prompt shapes: multiply-adds a second on this
// machine's threads. A measurement, hidden from the default run:
//   build/release/kernels/tophat_kernels_test "[.gemm_f32]"
TEST_CASE("The float32 prompt kernel's rate", "[.gemm_f32]") {
  if (!CpuHasAvx512()) return;
  auto seconds = [](const std::function<void()>& run) { return testing::BestSeconds(5, run); };
  std::printf("%-20s %5s %10s %10s %10s %10s %8s %8s\n", "matrix", "rows", "kernel", "BLAS",
              "bf16 kern", "bf16 prod", "vs BLAS", "prod/f32");
  for (auto [n, k] : {std::pair<int64_t, int64_t>{2048, 768}, {768, 2048}, {4096, 4096}}) {
    const at::Tensor w = at::randn({n, k});
    const at::Tensor wb = w.to(at::kBFloat16);
    for (int64_t m : {32, 128, 512}) {
      const at::Tensor x = at::randn({m, k});
      at::Tensor out = at::empty({m, n});
      const double kernel = seconds([&] { LinearF32PromptOut(x, w, {}, out); });
      const double bf16 = seconds([&] { LinearF32PromptOut(x, wb, {}, out); });
      const double blas = seconds([&] { at::mm_out(out, x, w.t()); });
      // bfloat16 products (AVX512_BF16), where the CPU has them.
      const double products =
          Bf16PromptKernelAvailable() ? seconds([&] { LinearBf16PromptOut(x, wb, {}, out); }) : 0.0;
      const double flops = 2.0 * m * n * k;
      std::printf(
          "[%5ld, %5ld] %11ld %7.2f ms %7.2f ms %7.2f ms %7.2f ms %7.2fx %7.2fx   (%.0f / %.0f "
          "/ %.0f GFLOP/s)\n",
          static_cast<long>(n), static_cast<long>(k), static_cast<long>(m), kernel * 1e3,
          blas * 1e3, bf16 * 1e3, products * 1e3, blas / kernel,
          products > 0 ? kernel / products : 0.0, flops / kernel / 1e9, flops / blas / 1e9,
          products > 0 ? flops / products / 1e9 : 0.0);
    }
  }
  SUCCEED();
}

}  // namespace
}  // namespace tophat::kernels
