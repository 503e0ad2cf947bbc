#include "kernels/decode_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "kernels/gemv.h"

#ifdef TOPHAT_HAVE_CUDA
#include "kernels/cuda_device.h"
#include "kernels/fused_ops_cuda.cuh"
#include "kernels/paged_attention_cuda.cuh"
#endif

namespace tophat::kernels {

namespace {

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
void Attend(const at::Tensor& q, const KvRows& k, const KvRows& v, int64_t kv_heads,
            std::span<const int32_t> block_table, int64_t block_size, int64_t first,
            int64_t positions, double scale, double softcap, const float* sinks, at::Tensor& out) {
  const int64_t heads = q.size(0);
  const int64_t hd = q.size(1);
  const int64_t group = heads / kv_heads;
  const float scale_f = static_cast<float>(scale);
  const auto softcap_f = static_cast<float>(softcap);
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  // Heads are independent: split them over the decode GEMV's threads once the K/V rows to
  // read make a fork worth it (a one-thread decode attention left the other core idle for
  // 11% of a 1,500-token decode, docs/benchmarks.md).
  const int threads =
      heads * (positions - first) * hd < (1 << 15) ? 1 : std::min<int>(SingleRowThreads(), heads);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t h = 0; h < heads; ++h) {
    thread_local std::vector<float> scores;
    scores.resize(positions - first);
    AttendHead(qp + h * q.stride(0), k, v, h / group, hd, block_table, block_size, first, positions,
               scale_f, softcap_f, scores.data(), op + h * hd,
               sinks != nullptr ? sinks[h] : -INFINITY);
  }
}

}  // namespace

KvRows KvRowsOf(const at::Tensor& blocks) {
  return {blocks.data_ptr<float>(), blocks.stride(0), blocks.stride(1), blocks.stride(2)};
}

// Compiled for AVX-512 and AVX2 as well as the baseline, the best chosen at load: the
// baseline's 4-wide loops read an out-of-cache KV at a third of the machine's memory rate
// (the `[.attention_stream]` case in decode_attention_stream_test.cc, docs/benchmarks.md).
#if defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void AttendHead(const float* q, const KvRows& k, const KvRows& v, int64_t kv_head,
                int64_t head_dim, std::span<const int32_t> block_table, int64_t block_size,
                int64_t first, int64_t positions, float scale, float softcap, float* scores,
                float* out, float sink) {
  const int64_t hd = head_dim;
  // A sink (gpt-oss) is one more logit in the softmax, with no value row.
  float max_score = sink;
  // Block by block from the one holding `first` (which may start inside it).
  for (int64_t j = first; j < positions;) {
    const int64_t offset = j % block_size;
    const int64_t rows = std::min(block_size - offset, positions - j);
    const float* kb = k.base + block_table[j / block_size] * k.block_stride +
                      offset * k.row_stride + kv_head * k.head_stride;
    float* s = scores + (j - first);
    for (int64_t r = 0; r < rows; ++r) {
      const float* kr = kb + r * k.row_stride;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < hd; ++i) dot += q[i] * kr[i];
      s[r] = dot * scale;
      // transformers' order: divided by the cap, tanh, multiplied by it.
      if (softcap > 0) s[r] = std::tanh(s[r] / softcap) * softcap;
      max_score = std::max(max_score, s[r]);
    }
    j += rows;
  }
  float total = sink == -INFINITY ? 0.0f : std::exp(sink - max_score);
  for (int64_t j = 0; j < positions - first; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    total += scores[j];
  }
  for (int64_t i = 0; i < hd; ++i) out[i] = 0.0f;
  const float inv_total = 1.0f / total;
  for (int64_t j = first; j < positions;) {
    const int64_t offset = j % block_size;
    const int64_t rows = std::min(block_size - offset, positions - j);
    const float* vb = v.base + block_table[j / block_size] * v.block_stride +
                      offset * v.row_stride + kv_head * v.head_stride;
    const float* s = scores + (j - first);
    for (int64_t r = 0; r < rows; ++r) {
      const float* vr = vb + r * v.row_stride;
      const float p = s[r] * inv_total;
#pragma omp simd
      for (int64_t i = 0; i < hd; ++i) out[i] += p * vr[i];
    }
    j += rows;
  }
}

void SwiGluRow(const float* gate, const float* up, int64_t n, float* out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void GeluTanhGluRow(const float* gate, const float* up, int64_t n, float* out) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kBeta * (x + kKappa * x * x * x))) * up[i];
  }
}

void GeluTanhGluOut(const at::Tensor& gate_up, at::Tensor& out) {
  const int64_t inner = gate_up.size(-1) / 2;
  const int64_t rows = inner == 0 ? 0 : gate_up.numel() / (2 * inner);
  if (!gate_up.is_cpu() || gate_up.scalar_type() != at::kFloat || !gate_up.is_contiguous() ||
      gate_up.requires_grad() || !out.is_contiguous() || out.scalar_type() != at::kFloat ||
      !out.is_cpu() || out.numel() != rows * inner) {
    out.copy_(at::gelu(gate_up.narrow(-1, 0, inner), "tanh") * gate_up.narrow(-1, inner, inner));
    return;
  }
  const float* in = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    GeluTanhGluRow(in + r * 2 * inner, in + r * 2 * inner + inner, inner, o + r * inner);
  }
}

bool DecodeAttention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                     double scale, at::Tensor& out) {
  if (!QueryFits(q, out) || !KvFits(q, keys, values, 3)) return false;
  static constexpr int32_t kOneBlock[] = {0};
  const KvRows k{keys.data_ptr<float>(), 0, keys.stride(0), keys.stride(1)};
  const KvRows v{values.data_ptr<float>(), 0, values.stride(0), values.stride(1)};
  Attend(q, k, v, keys.size(1), kOneBlock, keys.size(0), 0, keys.size(0), scale, 0, nullptr, out);
  return true;
}

bool PagedDecodeAttention(const at::Tensor& q, const at::Tensor& key_blocks,
                          const at::Tensor& value_blocks, std::span<const int32_t> block_table,
                          int64_t positions, double scale, at::Tensor& out, int64_t first,
                          double softcap, const at::Tensor& sinks) {
  if (!QueryFits(q, out) || !KvFits(q, key_blocks, value_blocks, 4)) return false;
  if (sinks.defined() && (!sinks.is_cpu() || sinks.scalar_type() != at::kFloat ||
                          !sinks.is_contiguous() || sinks.numel() != q.size(0))) {
    return false;
  }
  const int64_t num_blocks = key_blocks.size(0);
  const int64_t block_size = key_blocks.size(1);
  if (positions < 0 || first < 0 || first >= std::max<int64_t>(positions, 1) || block_size < 1) {
    return false;
  }
  const int64_t needed = (positions + block_size - 1) / block_size;
  if (needed > static_cast<int64_t>(block_table.size())) return false;
  for (int64_t b = 0; b < needed; ++b) {
    if (block_table[b] < 0 || block_table[b] >= num_blocks) return false;
  }
  Attend(q, KvRowsOf(key_blocks), KvRowsOf(value_blocks), key_blocks.size(2), block_table,
         block_size, first, positions, scale, softcap,
         sinks.defined() ? sinks.data_ptr<float>() : nullptr, out);
  return true;
}

void ClampedSwiGluOut(const at::Tensor& gate_up, at::Tensor& out, float alpha, float limit) {
  const int64_t inner = gate_up.size(-1) / 2;
  const int64_t rows = inner == 0 ? 0 : gate_up.numel() / (2 * inner);
  if (!gate_up.is_cpu() || gate_up.scalar_type() != at::kFloat || !gate_up.is_contiguous() ||
      !out.is_cpu() || out.scalar_type() != at::kFloat || !out.is_contiguous() ||
      out.numel() != rows * inner || gate_up.requires_grad()) {
    // Other dtypes and devices: the composite form, in transformers' order and dtype.
    const at::Tensor gate = gate_up.narrow(-1, 0, inner).clamp_max(limit);
    const at::Tensor up = gate_up.narrow(-1, inner, inner).clamp(-limit, limit);
    out.copy_((up + 1) * (gate * at::sigmoid(gate * alpha)));
    return;
  }
  const float* in = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = in + r * 2 * inner;
    const float* up = gate + inner;
    float* y = o + r * inner;
    // transformers' order: g * sigmoid(g * alpha), then (up + 1) times it.
    for (int64_t i = 0; i < inner; ++i) {
      const float g = std::min(gate[i], limit);
      const float u = std::clamp(up[i], -limit, limit);
      const float glu = g * (1.0f / (1.0f + std::exp(-(g * alpha))));
      y[i] = (u + 1.0f) * glu;
    }
  }
}

at::Tensor SwiGlu(const at::Tensor& gate_up) {
  const int64_t inner = gate_up.size(-1) / 2;
  if (gate_up.requires_grad()) {  // training: autograd records the composite ops
    return at::silu(gate_up.narrow(-1, 0, inner)) * gate_up.narrow(-1, inner, inner);
  }
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() = inner;
  at::Tensor out = at::empty(shape, gate_up.options().memory_format(at::MemoryFormat::Contiguous));
  SwiGluOut(gate_up, out);
  return out;
}

void SwiGluOut(const at::Tensor& gate_up, at::Tensor& out) {
  const int64_t inner = gate_up.size(-1) / 2;
  const int64_t rows = inner == 0 ? 0 : gate_up.numel() / (2 * inner);
  const bool out_fits = out.is_contiguous() && out.scalar_type() == gate_up.scalar_type() &&
                        out.device() == gate_up.device() && out.numel() == rows * inner;
#ifdef TOPHAT_HAVE_CUDA
  if (const auto dtype = ToCudaDtype(gate_up.scalar_type());
      gate_up.is_cuda() && dtype && gate_up.is_contiguous() && !gate_up.requires_grad() &&
      out_fits) {
    const SwiGluArgs args{.dtype = *dtype,
                          .gate_up = gate_up.data_ptr(),
                          .out = out.data_ptr(),
                          .rows = rows,
                          .inner = inner,
                          .stream = CurrentCudaStream(),
                          .overlap = OverlapKernelLaunches()};
    std::string error;
    const LaunchResult result = LaunchSwiGlu(args, &error);
    TORCH_CHECK(result != LaunchResult::kCudaError, "SwiGLU kernel: ", error);
    if (result == LaunchResult::kLaunched) return;
  }
#endif
  if (!gate_up.is_cpu() || gate_up.scalar_type() != at::kFloat || !gate_up.is_contiguous() ||
      gate_up.requires_grad() || !out_fits) {
    out.copy_(at::silu(gate_up.narrow(-1, 0, inner)) * gate_up.narrow(-1, inner, inner));
    return;
  }
  const float* in = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    SwiGluRow(in + r * 2 * inner, in + r * 2 * inner + inner, inner, o + r * inner);
  }
}

bool PagedDecodeAttentionBatch(const at::Tensor& q, const at::Tensor& key_blocks,
                               const at::Tensor& value_blocks, const at::Tensor& block_tables,
                               const at::Tensor& seq_lens, int64_t window, double scale,
                               at::Tensor& out, const at::Tensor& partials,
                               const at::Tensor& split_counters) {
#ifdef TOPHAT_HAVE_CUDA
  const at::ScalarType dtype = q.scalar_type();
  const std::optional<CudaDtype> cuda_dtype = ToCudaDtype(dtype);
  if (!cuda_dtype) return false;
  const bool fits =
      q.is_cuda() && q.dim() == 3 && q.is_contiguous() && key_blocks.dim() == 4 &&
      key_blocks.is_contiguous() && value_blocks.is_contiguous() &&
      value_blocks.sizes() == key_blocks.sizes() && key_blocks.scalar_type() == dtype &&
      value_blocks.scalar_type() == dtype && key_blocks.device() == q.device() &&
      value_blocks.device() == q.device() && key_blocks.size(3) == q.size(2) &&
      block_tables.dim() == 2 && block_tables.scalar_type() == at::kInt &&
      block_tables.is_contiguous() && block_tables.device() == q.device() &&
      block_tables.size(0) == q.size(0) && seq_lens.dim() == 1 &&
      seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous() &&
      seq_lens.device() == q.device() && seq_lens.size(0) == q.size(0) &&
      out.is_contiguous() && out.scalar_type() == dtype && out.device() == q.device() &&
      out.numel() == q.numel() && !q.requires_grad();
  if (!fits) return false;
  const bool has_partials = partials.defined();
  if (has_partials && !(partials.scalar_type() == at::kFloat && partials.is_contiguous() &&
                        partials.device() == q.device())) {
    return false;
  }
  const bool has_counters = has_partials && split_counters.defined() && FusedSplitMerge();
  if (has_counters && !(split_counters.scalar_type() == at::kInt &&
                        split_counters.is_contiguous() && split_counters.device() == q.device())) {
    return false;
  }
  const PagedDecodeAttentionArgs args{
      .dtype = *cuda_dtype,
      .q = q.data_ptr(),
      .key_blocks = key_blocks.data_ptr(),
      .value_blocks = value_blocks.data_ptr(),
      .block_tables = block_tables.data_ptr<int32_t>(),
      .seq_lens = seq_lens.data_ptr<int32_t>(),
      .out = out.data_ptr(),
      .num_seqs = static_cast<int>(q.size(0)),
      .num_heads = static_cast<int>(q.size(1)),
      .num_kv_heads = static_cast<int>(key_blocks.size(2)),
      .head_dim = static_cast<int>(q.size(2)),
      .block_size = static_cast<int>(key_blocks.size(1)),
      .max_blocks_per_seq = static_cast<int>(block_tables.size(1)),
      .window = static_cast<int>(window),
      .scale = static_cast<float>(scale),
      .stream = CurrentCudaStream(),
      .partials = has_partials ? partials.data_ptr<float>() : nullptr,
      .partial_floats = has_partials ? partials.numel() : 0,
      .split_counters = has_counters ? split_counters.data_ptr<int32_t>() : nullptr,
      .split_counter_count = has_counters ? split_counters.numel() : 0,
      .overlap = OverlapKernelLaunches()};
  std::string error;
  switch (LaunchPagedDecodeAttention(args, &error)) {
    case LaunchResult::kLaunched:
      return true;
    case LaunchResult::kUnsupported:
      return false;
    case LaunchResult::kCudaError:
      TORCH_CHECK(false, "paged decode attention kernel: ", error);
  }
  return false;
#else
  return false;
#endif
}

at::Tensor PagedDecodeWorkspace(int64_t heads, int64_t kv_heads, int64_t head_dim,
                                at::Device device) {
#ifdef TOPHAT_HAVE_CUDA
  if (!device.is_cuda() || kv_heads <= 0) return {};
  return at::empty({PagedDecodePartialFloats(heads, kv_heads, head_dim)},
                   at::TensorOptions().dtype(at::kFloat).device(device));
#else
  (void)heads;
  (void)kv_heads;
  (void)head_dim;
  (void)device;
  return {};
#endif
}

namespace {
std::atomic<bool> fused_split_merge{true};
}  // namespace

bool FusedSplitMerge() { return fused_split_merge.load(std::memory_order_relaxed); }

void SetFusedSplitMerge(bool enabled) {
  fused_split_merge.store(enabled, std::memory_order_relaxed);
}

at::Tensor PagedDecodeSplitCounters(at::Device device) {
#ifdef TOPHAT_HAVE_CUDA
  if (!device.is_cuda()) return {};
  return at::zeros({PagedDecodeSplitCounterCount()},
                   at::TensorOptions().dtype(at::kInt).device(device));
#else
  (void)device;
  return {};
#endif
}

int PagedDecodeSplitCount(int64_t seqs, int64_t heads, int64_t kv_heads, int64_t head_dim,
                          const at::Tensor& partials) {
#ifdef TOPHAT_HAVE_CUDA
  if (!partials.defined()) return 1;
  PagedDecodeAttentionArgs args;
  args.num_seqs = static_cast<int>(seqs);
  args.num_heads = static_cast<int>(heads);
  args.num_kv_heads = static_cast<int>(kv_heads);
  args.head_dim = static_cast<int>(head_dim);
  args.partials = partials.data_ptr<float>();
  args.partial_floats = partials.numel();
  return PagedDecodeSplits(args);
#else
  (void)seqs;
  (void)heads;
  (void)kv_heads;
  (void)head_dim;
  (void)partials;
  return 1;
#endif
}

}  // namespace tophat::kernels
