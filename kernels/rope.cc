#include "kernels/rope.h"

namespace tophat::kernels {

at::Tensor RotaryEmbedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const bool fast = x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 3 &&
                    x.stride(2) == 1 && cos.scalar_type() == at::kFloat &&
                    sin.scalar_type() == at::kFloat && cos.dim() == 2 &&
                    cos.size(0) == x.size(0) && cos.size(1) * 2 == x.size(2) &&
                    sin.sizes() == cos.sizes() && !x.requires_grad();
  const int64_t half = x.size(-1) / 2;
  if (!fast) {
    at::Tensor c = cos.unsqueeze(-2).to(x.scalar_type());
    at::Tensor s = sin.unsqueeze(-2).to(x.scalar_type());
    at::Tensor x1 = x.narrow(-1, 0, half);
    at::Tensor x2 = x.narrow(-1, half, half);
    return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
  }
  const at::Tensor cc = cos.contiguous();
  const at::Tensor sc = sin.contiguous();
  const int64_t tokens = x.size(0);
  const int64_t heads = x.size(1);
  at::Tensor out = at::empty({tokens, heads, 2 * half}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float* cp = cc.data_ptr<float>();
  const float* sp = sc.data_ptr<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = cp + t * half;
    const float* s = sp + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      const float* in = xp + t * x.stride(0) + h * x.stride(1);
      float* o = op + (t * heads + h) * 2 * half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        o[i] = in[i] * c[i] - in[i + half] * s[i];
        o[i + half] = in[i + half] * c[i] + in[i] * s[i];
      }
    }
  }
  return out;
}

}  // namespace tophat::kernels
