#include "kernels/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tophat::kernels {

namespace {

// Where one K or V tensor keeps its rows: row r of block b, KV head kv, starts at
// base + b * block_stride + r * row_stride + kv * head_stride (head_dim floats, contiguous).
struct RowLayout {
  const float* base;
  int64_t block_stride;
  int64_t row_stride;
  int64_t head_stride;
};

// The checks both entry points share: q [heads, head_dim] and out, float32 CPU.
bool QueryFits(const at::Tensor& q, const at::Tensor& out) {
  return q.is_cpu() && q.scalar_type() == at::kFloat && q.dim() == 2 && q.stride(1) == 1 &&
         out.is_cpu() && out.is_contiguous() && out.scalar_type() == at::kFloat &&
         out.numel() == q.numel() && !q.requires_grad();
}

// K/V of `dims` dimensions ([..., kv_heads, head_dim]), float32 CPU, last dim contiguous,
// and a head count that groups evenly over the KV heads.
bool KvFits(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
            int64_t dims) {
  return keys.is_cpu() && values.is_cpu() && keys.scalar_type() == at::kFloat &&
         values.scalar_type() == at::kFloat && keys.dim() == dims &&
         values.sizes() == keys.sizes() && keys.stride(dims - 1) == 1 &&
         values.stride(dims - 1) == 1 && keys.size(dims - 1) == q.size(1) &&
         keys.size(dims - 2) > 0 && q.size(0) % keys.size(dims - 2) == 0;
}

// Rows are visited block by block, so the contiguous case (one block) runs the same loops
// as a plain [positions, kv_heads, head_dim] kernel, with no division per row.
void Attend(const at::Tensor& q, const RowLayout& k, const RowLayout& v, int64_t kv_heads,
            std::span<const int32_t> block_table, int64_t block_size, int64_t positions,
            double scale, at::Tensor& out) {
  const int64_t heads = q.size(0);
  const int64_t hd = q.size(1);
  const int64_t group = heads / kv_heads;
  const float scale_f = static_cast<float>(scale);
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  thread_local std::vector<float> scores;
  scores.resize(positions);
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = qp + h * q.stride(0);
    const int64_t kv = h / group;
    float max_score = -INFINITY;
    for (int64_t b = 0, j = 0; j < positions; ++b) {
      const int64_t rows = std::min(block_size, positions - j);
      const float* kb = k.base + block_table[b] * k.block_stride + kv * k.head_stride;
      float* s = scores.data() + j;
      for (int64_t r = 0; r < rows; ++r) {
        const float* kr = kb + r * k.row_stride;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < hd; ++i) dot += qh[i] * kr[i];
        s[r] = dot * scale_f;
        max_score = std::max(max_score, s[r]);
      }
      j += rows;
    }
    float total = 0.0f;
    for (int64_t j = 0; j < positions; ++j) {
      scores[j] = std::exp(scores[j] - max_score);
      total += scores[j];
    }
    float* o = op + h * hd;
    for (int64_t i = 0; i < hd; ++i) o[i] = 0.0f;
    const float inv_total = 1.0f / total;
    for (int64_t b = 0, j = 0; j < positions; ++b) {
      const int64_t rows = std::min(block_size, positions - j);
      const float* vb = v.base + block_table[b] * v.block_stride + kv * v.head_stride;
      const float* s = scores.data() + j;
      for (int64_t r = 0; r < rows; ++r) {
        const float* vr = vb + r * v.row_stride;
        const float p = s[r] * inv_total;
#pragma omp simd
        for (int64_t i = 0; i < hd; ++i) o[i] += p * vr[i];
      }
      j += rows;
    }
  }
}

}  // namespace

bool DecodeAttention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                     double scale, at::Tensor& out) {
  if (!QueryFits(q, out) || !KvFits(q, keys, values, 3)) return false;
  static constexpr int32_t kOneBlock[] = {0};
  const RowLayout k{keys.data_ptr<float>(), 0, keys.stride(0), keys.stride(1)};
  const RowLayout v{values.data_ptr<float>(), 0, values.stride(0), values.stride(1)};
  Attend(q, k, v, keys.size(1), kOneBlock, keys.size(0), keys.size(0), scale, out);
  return true;
}

bool PagedDecodeAttention(const at::Tensor& q, const at::Tensor& key_blocks,
                          const at::Tensor& value_blocks, std::span<const int32_t> block_table,
                          int64_t positions, double scale, at::Tensor& out) {
  if (!QueryFits(q, out) || !KvFits(q, key_blocks, value_blocks, 4)) return false;
  const int64_t num_blocks = key_blocks.size(0);
  const int64_t block_size = key_blocks.size(1);
  if (positions < 0 || block_size < 1) return false;
  const int64_t needed = (positions + block_size - 1) / block_size;
  if (needed > static_cast<int64_t>(block_table.size())) return false;
  for (int64_t b = 0; b < needed; ++b) {
    if (block_table[b] < 0 || block_table[b] >= num_blocks) return false;
  }
  const RowLayout k{key_blocks.data_ptr<float>(), key_blocks.stride(0), key_blocks.stride(1),
                    key_blocks.stride(2)};
  const RowLayout v{value_blocks.data_ptr<float>(), value_blocks.stride(0),
                    value_blocks.stride(1), value_blocks.stride(2)};
  Attend(q, k, v, key_blocks.size(2), block_table, block_size, positions, scale, out);
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
