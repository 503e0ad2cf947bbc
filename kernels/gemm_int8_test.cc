#include "kernels/gemm_int8.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>

#include "kernels/gemv_int8.h"
#include "kernels/gemv_mxfp4.h"
#include "kernels/test_inputs.h"

namespace tophat::kernels {
namespace {

// The instruction sets this CPU runs that have the prompt kernel.
std::vector<W8A8Isa> PromptIsas() {
  std::vector<W8A8Isa> isas;
  for (W8A8Isa isa : SupportedW8A8Isas()) {
    if (HasInt8Gemm(isa)) isas.push_back(isa);
  }
  return isas;
}

// Rows past the row kernels' most: tiles of four x rows and every remainder, and more.
constexpr int64_t kPromptRows[] = {17, 18, 19, 20, 45};

TEST_CASE("The prompt kernel is offered where integer dot products beat float ones", "[kernels]") {
  CHECK_FALSE(HasInt8Gemm(W8A8Isa::kScalar));
  CHECK_FALSE(HasInt8Gemm(W8A8Isa::kAvx2));
  CHECK_FALSE(HasInt8Gemm(W8A8Isa::kNeon));
#if defined(__x86_64__)
  CHECK(HasInt8Gemm(W8A8Isa::kAvx512Vnni));
#elif defined(__aarch64__)
  CHECK(HasInt8Gemm(W8A8Isa::kNeonDot));
#endif
  // Where this CPU has none, the tests below check BLAS's path only: say so.
  if (PromptIsas().empty()) WARN("this CPU has no prompt kernel: only BLAS's path is tested");
}

TEST_CASE(
    "The prompt kernel matches LibTorch on the rounded x and the dequantized int8 "
    "matrix, for rows around its panels, tiles and chunks",
    "[kernels]") {
  at::manual_seed(21);
  // Weight rows around the 48-row panels (and 16- and 4-row vectors); widths of part of a
  // block, one block, a chunk of 8 and one more, and many.
  for (int64_t n : {1, 5, 47, 48, 49, 100, 2305}) {
    for (int64_t k : {13, 32, 100, 256, 288, 2100}) {
      const Int8Matrix w = QuantizeInt8PerRow(testing::UniformInputs({n, k}));
      const at::Tensor b = testing::UniformInputs({n});
      const at::Tensor dense = w.Dequantize();
      for (int64_t m : kPromptRows) {
        if (n * k * m > 20'000'000) continue;  // quick under the aarch64 emulator
        const at::Tensor x = testing::UniformInputs({m, k});
        const at::Tensor expected = at::linear(RoundActivationsInt8(x), dense);
        for (W8A8Isa isa : PromptIsas()) {
          INFO(W8A8IsaName(isa) << " n=" << n << " k=" << k << " m=" << m);
          // Block sums are exact; the float sums of blocks go in another order than BLAS's.
          CHECK(at::allclose(LinearW8A8WithIsa(isa, x, w), expected, 1e-4, 1e-3));
          CHECK(at::allclose(LinearW8A8WithIsa(isa, x, w, b), expected + b, 1e-4, 1e-3));
        }
        CHECK(at::allclose(LinearW8A8(x, w, b), expected + b, 1e-4, 1e-3));
      }
    }
  }
}

TEST_CASE(
    "The prompt kernel matches LibTorch on the rounded x and the dequantized MXFP4 "
    "matrix, for rows around its panels, tiles and chunks",
    "[kernels]") {
  at::manual_seed(22);
  for (int64_t n : {1, 5, 47, 48, 49, 100, 2880}) {
    for (int64_t k : {32, 256, 288, 2880}) {
      // Every code; exponents around 127 (scales 2^-8 to 2^7).
      const Mxfp4Matrix w{.blocks = at::randint(0, 256, {n, k / 32, 16}, at::kByte),
                          .scales = at::randint(119, 135, {n, k / 32}, at::kByte)};
      const at::Tensor b = testing::UniformInputs({n});
      const at::Tensor dense = w.Dequantize();
      // Sums of up to 2880 products of values up to 6 * 2^7 with x in [-1, 1], relative to
      // the row's magnitude; a wrong code, order or scale is off by far more.
      const double tolerance = 1e-5 * (1 + at::abs(dense).sum(1).max().item<double>());
      for (int64_t m : kPromptRows) {
        if (n * k * m > 20'000'000) continue;
        const at::Tensor x = testing::UniformInputs({m, k});
        const at::Tensor expected = at::linear(RoundActivationsInt8(x), dense);
        for (W8A8Isa isa : PromptIsas()) {
          INFO(W8A8IsaName(isa) << " n=" << n << " k=" << k << " m=" << m);
          CHECK((LinearMxfp4A8WithIsa(isa, x, w) - expected).abs().max().item<double>() <
                tolerance);
          CHECK((LinearMxfp4A8WithIsa(isa, x, w, b) - (expected + b)).abs().max().item<double>() <
                tolerance);
        }
        CHECK((LinearMxfp4A8(x, w, b) - (expected + b)).abs().max().item<double>() < tolerance);
      }
    }
  }
}

TEST_CASE(
    "The prompt kernel reads rows with a stride, keeps zeros, and makes NaN only of the "
    "rows that hold an infinity",
    "[kernels]") {
  at::manual_seed(23);
  const Int8Matrix w8 = QuantizeInt8PerRow(at::randn({100, 640}));
  const Mxfp4Matrix w4{.blocks = at::randint(0, 256, {100, 20, 16}, at::kByte),
                       .scales = at::randint(119, 135, {100, 20}, at::kByte)};
  at::Tensor x = at::randn({30, 640}) * 3;
  x[4].zero_();
  x[9][17] = std::numeric_limits<float>::infinity();
  // A view into a wider tensor: rows with a stride, read in place.
  const at::Tensor wide = at::cat({x, at::randn({30, 50})}, 1);
  const at::Tensor view = wide.narrow(1, 0, 640);
  REQUIRE(view.stride(0) == 690);
  for (W8A8Isa isa : PromptIsas()) {
    INFO(W8A8IsaName(isa));
    for (const at::Tensor& y :
         {LinearW8A8WithIsa(isa, view, w8), LinearMxfp4A8WithIsa(isa, view, w4)}) {
      CHECK(at::equal(y[4], at::zeros({100})));
      CHECK(at::isnan(y[9]).all().item<bool>());
      CHECK(at::isfinite(y.narrow(0, 10, 20)).all().item<bool>());
      CHECK(at::isfinite(y.narrow(0, 0, 9)).all().item<bool>());
    }
    CHECK(at::allclose(LinearW8A8WithIsa(isa, view, w8).narrow(0, 10, 20),
                       at::linear(RoundActivationsInt8(x.narrow(0, 10, 20)), w8.Dequantize()), 1e-4,
                       1e-3));
  }
}

// The prompt kernel's rate against the path it replaced (x rounded, the weights dequantized a
// block of rows at a time, BLAS in float32) and against BLAS alone on float32 weights held
// dequantized: multiply-adds a second on this machine's threads. A measurement, hidden from
// the default run:
//   build/release/kernels/tophat_kernels_test "[.gemm_prompt]"
TEST_CASE("The prompt kernel's rate on prompt-shaped products", "[.gemm_prompt]") {
  if (PromptIsas().empty()) {
    WARN("this CPU has no prompt kernel");
    return;
  }
  auto seconds = [](const std::function<void()>& run) { return testing::BestSeconds(5, run); };
  std::printf("%-32s %5s %-11s %10s %10s %10s %7s %7s\n", "matrix", "rows", "isa", "integer", "was",
              "BLAS f32", "vs was", "vs BLAS");
  auto report = [&](const char* name, int64_t m, int64_t n, int64_t k, W8A8Isa isa, double integer,
                    double was, double blas) {
    const double macs = static_cast<double>(m) * n * k;
    std::printf(
        "%-32s %5ld %-11s %7.2f ms %7.2f ms %7.2f ms %6.2fx %6.2fx   (%.0f / %.0f / %.0f G "
        "MAC/s)\n",
        name, static_cast<long>(m), std::string(W8A8IsaName(isa)).c_str(), integer * 1e3, was * 1e3,
        blas * 1e3, was / integer, blas / integer, macs / integer / 1e9, macs / was / 1e9,
        macs / blas / 1e9);
  };
  for (int64_t m : {32, 256}) {
    // gpt-oss-20b's expert matrices (gate and up together; down), MXFP4.
    for (auto [n, k] : {std::pair<int64_t, int64_t>{5760, 2880}, {2880, 2880}}) {
      const Mxfp4Matrix w{.blocks = at::randint(0, 256, {n, k / 32, 16}, at::kByte),
                          .scales = at::randint(119, 135, {n, k / 32}, at::kByte)};
      const at::Tensor x = at::randn({m, k});
      const at::Tensor dense = w.Dequantize();
      const double was = seconds([&] { LinearMxfp4(RoundActivationsInt8(x), w); });
      const double blas = seconds([&] { at::mm(x, dense.t()); });
      for (W8A8Isa isa : PromptIsas()) {
        const double integer = seconds([&] { LinearMxfp4A8WithIsa(isa, x, w); });
        report(n == 5760 ? "mxfp4 [5760, 2880] (gate, up)" : "mxfp4 [2880, 2880] (down)", m, n, k,
               isa, integer, was, blas);
      }
    }
    // A Llama-3-8B-shaped projection in int8.
    const Int8Matrix w = QuantizeInt8PerRow(at::randn({4096, 4096}));
    const at::Tensor x = at::randn({m, 4096});
    const at::Tensor dense = w.Dequantize();
    const double was = seconds([&] { LinearInt8(RoundActivationsInt8(x), w); });
    const double blas = seconds([&] { at::mm(x, dense.t()); });
    for (W8A8Isa isa : PromptIsas()) {
      const double integer = seconds([&] { LinearW8A8WithIsa(isa, x, w); });
      report("int8 [4096, 4096]", m, 4096, 4096, isa, integer, was, blas);
    }
  }
  SUCCEED();
}

}  // namespace
}  // namespace tophat::kernels
