#include "kernels/decode_attention.h"

#include <cmath>
#include <vector>

namespace tophat::kernels {

bool DecodeAttention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                     double scale, at::Tensor& out) {
  const bool fast = q.is_cpu() && q.scalar_type() == at::kFloat && q.dim() == 2 &&
                    q.stride(1) == 1 && keys.scalar_type() == at::kFloat && keys.dim() == 3 &&
                    values.sizes() == keys.sizes() && keys.stride(2) == 1 &&
                    values.stride(2) == 1 && keys.size(2) == q.size(1) &&
                    q.size(0) % keys.size(1) == 0 && out.is_contiguous() &&
                    out.scalar_type() == at::kFloat && out.numel() == q.numel() &&
                    !q.requires_grad();
  if (!fast) return false;
  const int64_t heads = q.size(0);
  const int64_t hd = q.size(1);
  const int64_t positions = keys.size(0);
  const int64_t group = heads / keys.size(1);
  const float* qp = q.data_ptr<float>();
  const float* kp = keys.data_ptr<float>();
  const float* vp = values.data_ptr<float>();
  float* op = out.data_ptr<float>();
  thread_local std::vector<float> scores;
  scores.resize(positions);
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = qp + h * q.stride(0);
    const int64_t kv = h / group;
    float max_score = -INFINITY;
    for (int64_t j = 0; j < positions; ++j) {
      const float* k = kp + j * keys.stride(0) + kv * keys.stride(1);
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < hd; ++i) dot += qh[i] * k[i];
      scores[j] = dot * static_cast<float>(scale);
      max_score = std::max(max_score, scores[j]);
    }
    float total = 0.0f;
    for (int64_t j = 0; j < positions; ++j) {
      scores[j] = std::exp(scores[j] - max_score);
      total += scores[j];
    }
    float* o = op + h * hd;
    for (int64_t i = 0; i < hd; ++i) o[i] = 0.0f;
    const float inv_total = 1.0f / total;
    for (int64_t j = 0; j < positions; ++j) {
      const float* v = vp + j * values.stride(0) + kv * values.stride(1);
      const float p = scores[j] * inv_total;
#pragma omp simd
      for (int64_t i = 0; i < hd; ++i) o[i] += p * v[i];
    }
  }
  return true;
}

at::Tensor SwiGlu(const at::Tensor& gate_up) {
  const int64_t inner = gate_up.size(-1) / 2;
  if (!gate_up.is_cpu() || gate_up.scalar_type() != at::kFloat || !gate_up.is_contiguous() ||
      gate_up.requires_grad()) {
    return at::silu(gate_up.narrow(-1, 0, inner)) * gate_up.narrow(-1, inner, inner);
  }
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() = inner;
  at::Tensor out = at::empty(shape, gate_up.options());
  const int64_t rows = inner == 0 ? 0 : gate_up.numel() / (2 * inner);
  const float* in = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = in + r * 2 * inner;
    const float* u = g + inner;
    float* y = o + r * inner;
#pragma omp simd
    for (int64_t i = 0; i < inner; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
  return out;
}

}  // namespace tophat::kernels
