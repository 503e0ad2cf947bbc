#include "kernels/decode_attention.h"

#include <catch2/catch.hpp>
#include <cmath>

namespace tophat::kernels {
namespace {

TEST_CASE("Decode attention matches the composite form with GQA and cache views", "[kernels]") {
  at::manual_seed(0);
  for (int64_t positions : {1, 9, 200}) {
    for (int64_t kv_heads : {1, 2, 4}) {
      const int64_t heads = 4;
      const int64_t hd = 32;
      // Views into a larger cache, as the engine passes them.
      at::Tensor cache_k = at::randn({256, kv_heads, hd});
      at::Tensor cache_v = at::randn({256, kv_heads, hd});
      at::Tensor keys = cache_k.narrow(0, 0, positions);
      at::Tensor values = cache_v.narrow(0, 0, positions);
      at::Tensor q = at::randn({heads, hd});
      at::Tensor out = at::empty({heads * hd});
      const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
      REQUIRE(DecodeAttention(q, keys, values, scale, out));
      const int64_t group = heads / kv_heads;
      at::Tensor k = keys.repeat_interleave(group, 1);    // [P, H, hd]
      at::Tensor v = values.repeat_interleave(group, 1);
      at::Tensor p = at::softmax(at::einsum("hd,phd->hp", {q, k}) * scale, -1);
      at::Tensor expected = at::einsum("hp,phd->hd", {p, v}).reshape({-1});
      INFO("positions=" << positions << " kv_heads=" << kv_heads);
      CHECK(at::allclose(out, expected, 1e-5, 1e-5));
    }
  }
  at::Tensor out = at::empty({8});
  CHECK_FALSE(DecodeAttention(at::randn({2, 4}, at::kDouble), at::randn({3, 1, 4}),
                              at::randn({3, 1, 4}), 0.5, out));
}

TEST_CASE("Fused SwiGLU matches silu(gate) * up", "[kernels]") {
  at::manual_seed(1);
  at::Tensor gate_up = at::randn({3, 2 * 50}) * 4;
  at::Tensor expected = at::silu(gate_up.narrow(1, 0, 50)) * gate_up.narrow(1, 50, 50);
  CHECK(at::allclose(SwiGlu(gate_up), expected, 1e-5, 1e-5));
  at::Tensor gd = at::randn({2, 8}, at::kDouble);
  CHECK(at::allclose(SwiGlu(gd), at::silu(gd.narrow(1, 0, 4)) * gd.narrow(1, 4, 4)));
}

}  // namespace
}  // namespace tophat::kernels
