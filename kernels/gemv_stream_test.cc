// The GEMV kernels' streaming rate out of cache on one core, against a loop that touches one
// byte per cache line of the same matrices: what kernels/prefetch.h was measured with
// (docs/benchmarks.md). A measurement, hidden from the default run:
//   build/release/kernels/tophat_kernels_test "[.gemv_stream]"
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <vector>

#include "kernels/gemv_int8.h"
#include "kernels/gemv_mxfp4.h"
#include "kernels/gemv_w8a8.h"

namespace tophat::kernels {
namespace {

TEST_CASE("GEMV kernels stream decode-shaped matrices out of cache", "[.gemv_stream]") {
  // 60 matrices of a bench-110m qkv's shape in int8: 106 MB, far past any cache.
  constexpr int64_t kRows = 2304;
  constexpr int64_t kCols = 768;
  constexpr int kMatrices = 60;
  std::vector<Int8Matrix> matrices;
  for (int m = 0; m < kMatrices; ++m) {
    matrices.push_back(QuantizeInt8PerRow(at::randn({kRows, kCols})));
  }
  const at::Tensor x = at::randn({kCols});
  std::vector<int8_t> rounded(kCols);
  std::vector<float> block_scale(kCols / kActivationBlock);
  RoundActivationRow(x.data_ptr<float>(), kCols, rounded.data(), block_scale.data());
  std::vector<float> y(kRows);
  int64_t touched = 0;

  // Each reads every matrix's kRows * kCols bytes once; bfloat16 reads the same bytes as
  // rows of kCols / 2 values.
  const std::vector<std::pair<const char*, void (*)(const Int8Matrix&, const float*,
                                                      const int8_t*, const float*, float*,
                                                      int64_t*)>>
      kernels = {
          {"w8a8",
           [](const Int8Matrix& m, const float*, const int8_t* q, const float* s, float* out,
              int64_t*) {
             LinearRowsW8A8(m.values.data_ptr<int8_t>(), kCols, m.scale.data_ptr<float>(), q, s,
                            out, kCols, 0, kRows);
           }},
          {"int8",
           [](const Int8Matrix& m, const float* xf, const int8_t*, const float*, float* out,
              int64_t*) {
             LinearRowsInt8(m.values.data_ptr<int8_t>(), kCols, m.scale.data_ptr<float>(), xf,
                            out, kCols, 0, kRows);
           }},
          {"bfloat16 (the same bytes)",
           [](const Int8Matrix& m, const float* xf, const int8_t*, const float*, float* out,
              int64_t*) {
             LinearRowsBf16(reinterpret_cast<const uint16_t*>(m.values.data_ptr<int8_t>()),
                            kCols / 2, xf, out, kCols / 2, 0, kRows);
           }},
          {"one byte per line",
           [](const Int8Matrix& m, const float*, const int8_t*, const float*, float*,
              int64_t* sum) {
             const int8_t* p = m.values.data_ptr<int8_t>();
             for (int64_t i = 0; i < kRows * kCols; i += 64) *sum += p[i];
           }},
      };
  for (const auto& [name, run] : kernels) {
    double best = 1e30;
    for (int repetition = 0; repetition < 15; ++repetition) {
      const auto start = std::chrono::steady_clock::now();
      for (const Int8Matrix& m : matrices) {
        run(m, x.data_ptr<float>(), rounded.data(), block_scale.data(), y.data(), &touched);
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                          start).count());
    }
    std::printf("%-28s %6.1f GB/s\n", name,
                static_cast<double>(kMatrices * kRows * kCols) / best / 1e9);
  }
  std::printf("(the touching loop's sum, so that its reads are kept: %lld)\n",
              static_cast<long long>(touched));
}

TEST_CASE("MXFP4 kernels stream gpt-oss expert matrices out of cache", "[.gemv_stream]") {
  // 32 experts' gate_up matrices of gpt-oss-20b's shape ([5760, 2880]; 8.8 MB each held
  // packed, 282 MB in all), one decode row, on every core (the kernels' own threading).
  constexpr int64_t kRows = 5760;
  constexpr int64_t kCols = 2880;
  std::vector<Mxfp4Matrix> experts;
  for (int e = 0; e < 32; ++e) {
    experts.push_back({.blocks = at::randint(0, 256, {kRows, kCols / 32, 16}, at::kByte),
                       .scales = at::randint(119, 135, {kRows, kCols / 32}, at::kByte)});
  }
  const at::Tensor x = at::randn({1, kCols});
  at::Tensor y = at::empty({1, kRows});
  for (const bool rounded : {false, true}) {
    double best = 1e30;
    for (int repetition = 0; repetition < 10; ++repetition) {
      const auto start = std::chrono::steady_clock::now();
      for (const Mxfp4Matrix& w : experts) {
        if (rounded) {
          LinearMxfp4A8Out(x, w, {}, y);
        } else {
          LinearMxfp4Out(x, w, {}, y);
        }
      }
      best = std::min(
          best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::printf("%-28s %6.1f GB/s\n", rounded ? "mxfp4, int8 activations" : "mxfp4",
                static_cast<double>(32 * experts[0].bytes()) / best / 1e9);
  }
}

}  // namespace
}  // namespace tophat::kernels
