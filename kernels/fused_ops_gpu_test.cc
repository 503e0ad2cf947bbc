// The fused CUDA kernels of a decoder layer (kernels/fused_ops.cu) against the composite
// LibTorch ops in float64 (label `gpu`; skipped without a device).
#include <catch2/catch.hpp>
#include <vector>

#include "kernels/decode_attention.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"

namespace tophat::kernels {
namespace {

const at::Device kCuda(at::kCUDA, 0);

// Relative tolerance of each storage dtype for one rounding of a float32 result.
double Tolerance(at::ScalarType dtype) {
  return dtype == at::kFloat ? 1e-5 : dtype == at::kHalf ? 2e-3 : 1.6e-2;
}

void CheckClose(const at::Tensor& got, const at::Tensor& want, at::ScalarType dtype) {
  REQUIRE(got.sizes() == want.sizes());
  const at::Tensor g = got.to(at::kCPU, at::kDouble);
  const at::Tensor w = want.to(at::kCPU, at::kDouble);
  const double error = (g - w).abs().max().item<double>();
  const double scale = w.abs().max().item<double>() + 1e-12;
  INFO(c10::toString(dtype) << ": max |error| " << error << " of " << scale);
  CHECK(error <= Tolerance(dtype) * scale);
}

at::Tensor RmsNormReference(const at::Tensor& x, const at::Tensor& w, double eps) {
  const at::Tensor xd = x.to(at::kDouble);
  return xd / at::sqrt((xd * xd).mean(-1, true) + eps) * w.to(at::kDouble);
}

at::Tensor RotaryReference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor xd = x.to(at::kDouble);
  const int64_t half = x.size(-1) / 2;
  const at::Tensor c = cos.to(at::kDouble).unsqueeze(1);
  const at::Tensor s = sin.to(at::kDouble).unsqueeze(1);
  const at::Tensor x1 = xd.narrow(-1, 0, half);
  const at::Tensor x2 = xd.narrow(-1, half, half);
  return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kHalf, at::kBFloat16};

TEST_CASE("CUDA RMSNorm, alone and after a residual add, matches float64", "[gpu][kernels]") {
  at::manual_seed(11);
  for (at::ScalarType dtype : kDtypes) {
    // 1001 (not whole 16-byte vectors) and float32 8192 (more vectors than the kernel holds
    // in registers) take the scalar kernel, the others the vector one.
    for (int64_t d : {64, 1000, 1001, 4096, 8192}) {
      const at::Tensor x = (at::randn({7, d}) * 3).to(kCuda, dtype);
      const at::Tensor w = at::randn({d}).to(kCuda, dtype);
      CheckClose(RmsNorm(x, w, 1e-5), RmsNormReference(x, w, 1e-5), dtype);

      const at::Tensor start = at::randn({7, d}).to(kCuda, dtype);
      at::Tensor residual = start.clone();
      const at::Tensor y = AddRmsNorm(residual, x, w, 1e-5);
      // The sum is rounded to the storage dtype once, as `start + x` is.
      CHECK(at::equal(residual, start + x));
      CheckClose(y, RmsNormReference(start + x, w, 1e-5), dtype);
    }
  }
}

TEST_CASE("CUDA head RMSNorm norms each head of a qkv row's part in place", "[gpu][kernels]") {
  at::manual_seed(15);
  for (at::ScalarType dtype : kDtypes) {
    for (int64_t hd : {64, 128, 100}) {
      const int64_t tokens = 11;
      const int64_t heads = 5;  // 55 heads: the last block of 8 part-filled
      const at::Tensor start = (at::randn({tokens, 3 * heads * hd}) * 3).to(kCuda, dtype);
      at::Tensor qkv = start.clone();
      const at::Tensor w = at::randn({hd}).to(kCuda, dtype);
      at::Tensor q = qkv.narrow(1, 0, heads * hd).view({tokens, heads, hd});
      const at::Tensor want = RmsNormReference(q, w, 1e-6);
      HeadRmsNormInPlace(q, w, 1e-6);
      CheckClose(q, want, dtype);
      CHECK(at::equal(qkv.narrow(1, heads * hd, 2 * heads * hd),
                      start.narrow(1, heads * hd, 2 * heads * hd)));
    }
  }
}

TEST_CASE("CUDA SwiGLU matches float64", "[gpu][kernels]") {
  at::manual_seed(12);
  for (at::ScalarType dtype : kDtypes) {
    const at::Tensor gate_up = (at::randn({5, 2 * 1000}) * 2).to(kCuda, dtype);
    const at::Tensor gd = gate_up.to(at::kDouble);
    const at::Tensor want = at::silu(gd.narrow(1, 0, 1000)) * gd.narrow(1, 1000, 1000);
    CheckClose(SwiGlu(gate_up), want, dtype);
  }
}

TEST_CASE("CUDA rotary embedding of strided heads matches float64", "[gpu][kernels]") {
  at::manual_seed(13);
  for (at::ScalarType dtype : kDtypes) {
    const int64_t tokens = 9;
    const int64_t heads = 4;
    const int64_t hd = 64;
    // Heads read from inside wider rows, as from a fused qkv projection.
    const at::Tensor rows = at::randn({tokens, 3 * heads * hd}).to(kCuda, dtype);
    const at::Tensor x = rows.narrow(1, heads * hd, heads * hd).view({tokens, heads, hd});
    const at::Tensor angles = at::rand({tokens, hd / 2}) * 6.28;
    const at::Tensor cos = angles.cos().to(kCuda);
    const at::Tensor sin = angles.sin().to(kCuda);
    CheckClose(RotaryEmbedding(x, cos, sin), RotaryReference(x, cos, sin), dtype);
  }
}

TEST_CASE("CUDA rotary qkv-to-cache rotates q and k and writes k and v into their slots",
          "[gpu][kernels]") {
  at::manual_seed(14);
  for (at::ScalarType dtype : kDtypes) {
    const int64_t tokens = 6;
    const int64_t heads = 8;
    const int64_t kv_heads = 2;
    const int64_t hd = 128;
    const int64_t num_slots = 64;
    const at::Tensor qkv =
        at::randn({tokens, (heads + 2 * kv_heads) * hd}).to(kCuda, dtype);
    const at::Tensor angles = at::rand({tokens, hd / 2}) * 6.28;
    const at::Tensor cos = angles.cos().to(kCuda);
    const at::Tensor sin = angles.sin().to(kCuda);
    const at::Tensor slots =
        at::tensor(std::vector<int64_t>{3, 17, 18, 40, 41, 63}, at::kLong).to(kCuda);
    at::Tensor key_slots = at::zeros({num_slots, kv_heads, hd}, qkv.options());
    at::Tensor value_slots = at::zeros({num_slots, kv_heads, hd}, qkv.options());
    at::Tensor q_out = at::empty({tokens, heads, hd}, qkv.options());
    REQUIRE(RotaryQkvToCache(qkv, cos, sin, heads, kv_heads, hd, key_slots, value_slots, slots,
                             q_out));
    INFO(c10::toString(dtype));
    CheckClose(q_out, RotaryReference(qkv.narrow(1, 0, heads * hd).view({tokens, heads, hd}),
                                      cos, sin),
               dtype);
    const at::Tensor k = qkv.narrow(1, heads * hd, kv_heads * hd).view({tokens, kv_heads, hd});
    const at::Tensor v =
        qkv.narrow(1, (heads + kv_heads) * hd, kv_heads * hd).view({tokens, kv_heads, hd});
    CheckClose(key_slots.index_select(0, slots), RotaryReference(k, cos, sin), dtype);
    CHECK(at::equal(value_slots.index_select(0, slots), v));
    // Slots not named stay untouched.
    at::Tensor untouched = at::ones({num_slots}, at::kBool);
    untouched.index_fill_(0, slots.cpu(), false);
    CHECK(key_slots.cpu().index({untouched}).abs().sum().item<double>() == 0.0);
    CHECK(value_slots.cpu().index({untouched}).abs().sum().item<double>() == 0.0);
  }
}

TEST_CASE("RotaryQkvToCache declines inputs it does not cover", "[gpu][kernels]") {
  const at::Tensor qkv = at::randn({2, (4 + 2 * 2) * 64}).to(kCuda);
  const at::Tensor cos = at::ones({2, 32}).to(kCuda);
  at::Tensor key_slots = at::zeros({8, 2, 64}, qkv.options());
  at::Tensor value_slots = at::zeros({8, 2, 64}, qkv.options());
  at::Tensor q_out = at::empty({2, 4, 64}, qkv.options());
  const at::Tensor slots = at::tensor(std::vector<int64_t>{0, 1}, at::kLong).to(kCuda);
  // Wrong head count for the row width; int32 slots; tables on the CPU.
  CHECK_FALSE(RotaryQkvToCache(qkv, cos, cos, 5, 2, 64, key_slots, value_slots, slots, q_out));
  CHECK_FALSE(RotaryQkvToCache(qkv, cos, cos, 4, 2, 64, key_slots, value_slots,
                               slots.to(at::kInt), q_out));
  CHECK_FALSE(RotaryQkvToCache(qkv, cos.cpu(), cos.cpu(), 4, 2, 64, key_slots, value_slots,
                               slots, q_out));
  CHECK(key_slots.abs().sum().item<double>() == 0.0);
}

}  // namespace
}  // namespace tophat::kernels
