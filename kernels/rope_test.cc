#include "kernels/rope.h"

#include <catch2/catch.hpp>

namespace tophat::kernels {
namespace {

at::Tensor Reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor c = at::cat({cos, cos}, -1).unsqueeze(1);
  at::Tensor s = at::cat({sin, sin}, -1).unsqueeze(1);
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * c + rotated * s;
}

TEST_CASE("Fused RoPE matches the rotate-half formula, also on strided views", "[kernels]") {
  at::manual_seed(0);
  for (int64_t tokens : {1, 5, 64}) {
    for (int64_t head_dim : {2, 16, 64}) {
      at::Tensor angles = at::rand({tokens, head_dim / 2}) * 6.0;
      at::Tensor cos = angles.cos();
      at::Tensor sin = angles.sin();
      // A [T, 4, hd] view into a wider fused row, as q and k are views into qkv.
      at::Tensor fused = at::randn({tokens, 7 * head_dim});
      at::Tensor x = fused.narrow(1, head_dim, 4 * head_dim).view({tokens, 4, head_dim});
      INFO("tokens=" << tokens << " head_dim=" << head_dim);
      CHECK(at::allclose(RotaryEmbedding(x, cos, sin), Reference(x, cos, sin), 1e-5, 1e-5));
    }
  }
  at::Tensor xd = at::randn({3, 2, 8}, at::kDouble);
  at::Tensor a = at::rand({3, 4}, at::kDouble);
  CHECK(at::allclose(RotaryEmbedding(xd, a.cos(), a.sin()), Reference(xd, a.cos(), a.sin())));
}

}  // namespace
}  // namespace tophat::kernels
