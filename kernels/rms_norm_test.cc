#include "kernels/rms_norm.h"

#include <catch2/catch.hpp>

namespace tophat::kernels {
namespace {

at::Tensor Reference(const at::Tensor& x, const at::Tensor& w, double eps) {
  return x / at::sqrt((x * x).mean(-1, true) + eps) * w;
}

TEST_CASE("CPU RMSNorm matches the LibTorch composite on random inputs", "[kernels]") {
  at::manual_seed(0);
  for (int64_t rows : {1, 3, 64}) {
    for (int64_t d : {1, 7, 64, 768}) {
      at::Tensor x = at::randn({rows, d}) * 3;
      at::Tensor w = at::randn({d});
      at::Tensor got = RmsNorm(x, w, 1e-5);
      INFO("rows=" << rows << " d=" << d);
      CHECK(at::allclose(got, Reference(x, w, 1e-5), 1e-5, 1e-5));
    }
  }
}

TEST_CASE("RMSNorm handles non-contiguous input and other dtypes", "[kernels]") {
  at::manual_seed(1);
  at::Tensor x = at::randn({8, 32}).t();  // [32, 8], strided
  at::Tensor w = at::randn({8});
  CHECK(at::allclose(RmsNorm(x, w, 1e-6), Reference(x, w, 1e-6), 1e-5, 1e-5));
  at::Tensor xd = at::randn({4, 16}, at::kDouble);
  at::Tensor wd = at::randn({16}, at::kDouble);
  CHECK(at::allclose(RmsNorm(xd, wd, 1e-6), Reference(xd, wd, 1e-6), 1e-9, 1e-9));
}

TEST_CASE("Head RMSNorm norms each head of a qkv row's part in place and nothing else",
          "[kernels]") {
  at::manual_seed(3);
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {  // the fused loop and the composite
    for (int64_t tokens : {1, 9}) {
      const int64_t heads = 4;
      const int64_t kv_heads = 2;
      const int64_t hd = 32;
      const at::Tensor start = at::randn({tokens, (heads + 2 * kv_heads) * hd}, dtype) * 3;
      at::Tensor qkv = start.clone();
      const at::Tensor w = at::randn({hd}, dtype);
      at::Tensor k = qkv.narrow(1, heads * hd, kv_heads * hd).view({tokens, kv_heads, hd});
      HeadRmsNormInPlace(k, w, 1e-6);
      INFO(c10::toString(dtype) << " tokens=" << tokens);
      const at::Tensor want = Reference(
          start.narrow(1, heads * hd, kv_heads * hd).view({tokens, kv_heads, hd}), w, 1e-6);
      CHECK(at::allclose(k, want, 1e-5, 1e-5));
      // The queries and values around the keys are untouched.
      CHECK(at::equal(qkv.narrow(1, 0, heads * hd), start.narrow(1, 0, heads * hd)));
      CHECK(at::equal(qkv.narrow(1, (heads + kv_heads) * hd, kv_heads * hd),
                      start.narrow(1, (heads + kv_heads) * hd, kv_heads * hd)));
    }
  }
}

TEST_CASE("AddRmsNorm adds into the residual in place and normalises the sum", "[kernels]") {
  at::manual_seed(2);
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {  // the fused loop and the composite
    for (int64_t rows : {1, 5}) {
      const int64_t d = 96;
      const at::Tensor start = at::randn({rows, d}, dtype);
      const at::Tensor delta = at::randn({rows, d}, dtype);
      const at::Tensor w = at::randn({d}, dtype);
      at::Tensor residual = start.clone();
      const at::Tensor got = AddRmsNorm(residual, delta, w, 1e-5);
      INFO(c10::toString(dtype) << " rows=" << rows);
      CHECK(at::equal(residual, start + delta));
      CHECK(at::allclose(got, Reference(start + delta, w, 1e-5), 1e-5, 1e-5));
    }
  }
}

}  // namespace
}  // namespace tophat::kernels
