#include "kernels/rope.h"

#include <c10/util/Exception.h>

#include <string>

#ifdef TOPHAT_HAVE_CUDA
#include "kernels/cuda_device.h"
#include "kernels/fused_ops_cuda.cuh"
#endif

namespace tophat::kernels {
namespace {

bool RotaryTablesFit(const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& x,
                     int64_t tokens, int64_t head_dim) {
  return cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.dim() == 2 &&
         cos.size(0) == tokens && cos.size(1) * 2 == head_dim && sin.sizes() == cos.sizes() &&
         cos.is_contiguous() && sin.is_contiguous() && cos.device() == x.device() &&
         sin.device() == x.device();
}

// The CUDA rotation of x [T, heads, head_dim] into `out` (contiguous, x's shape); false,
// launching nothing, when the kernel does not take these inputs.
bool RotaryCuda(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                at::Tensor& out) {
#ifdef TOPHAT_HAVE_CUDA
  const auto dtype = ToCudaDtype(x.scalar_type());
  if (!x.is_cuda() || !dtype || x.dim() != 3 || x.stride(2) != 1 || x.requires_grad() ||
      !RotaryTablesFit(cos, sin, x, x.size(0), x.size(2)) || !out.is_contiguous() ||
      out.sizes() != x.sizes() || out.scalar_type() != x.scalar_type() ||
      out.device() != x.device()) {
    return false;
  }
  const RotaryArgs args{.dtype = *dtype,
                        .x = x.data_ptr(),
                        .row_stride = x.stride(0),
                        .head_stride = x.stride(1),
                        .out = out.data_ptr(),
                        .cos = cos.data_ptr<float>(),
                        .sin = sin.data_ptr<float>(),
                        .tokens = x.size(0),
                        .heads = static_cast<int>(x.size(1)),
                        .head_dim = static_cast<int>(x.size(2)),
                        .stream = CurrentCudaStream(),
                        .overlap = OverlapKernelLaunches()};
  std::string error;
  switch (LaunchRotary(args, &error)) {
    case LaunchResult::kLaunched:
      return true;
    case LaunchResult::kUnsupported:
      return false;
    case LaunchResult::kCudaError:
      TORCH_CHECK(false, "rotary embedding kernel: ", error);
  }
#else
  (void)x, (void)cos, (void)sin, (void)out;
#endif
  return false;
}

at::Tensor RotaryComposite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor c = cos.unsqueeze(-2).to(x.scalar_type());
  at::Tensor s = sin.unsqueeze(-2).to(x.scalar_type());
  at::Tensor x1 = x.narrow(-1, 0, half);
  at::Tensor x2 = x.narrow(-1, half, half);
  return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

}  // namespace

void RotateHeadRow(const float* in, const float* cos, const float* sin, int64_t half,
                   float* out) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    out[i] = in[i] * cos[i] - in[i + half] * sin[i];
    out[i + half] = in[i + half] * cos[i] + in[i] * sin[i];
  }
}

at::Tensor RotaryEmbedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // Training records autograd through the composite ops, which allocate their own result.
  if (x.requires_grad()) return RotaryComposite(x, cos, sin);
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  RotaryEmbeddingOut(x, cos, sin, out);
  return out;
}

void RotaryEmbeddingOut(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        at::Tensor& out) {
  const bool fast = x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 3 &&
                    x.stride(2) == 1 && cos.scalar_type() == at::kFloat &&
                    sin.scalar_type() == at::kFloat && cos.dim() == 2 &&
                    cos.size(0) == x.size(0) && cos.size(1) * 2 == x.size(2) &&
                    sin.sizes() == cos.sizes() && !x.requires_grad() && out.is_cpu() &&
                    out.scalar_type() == at::kFloat && out.is_contiguous() &&
                    out.sizes() == x.sizes();
  const int64_t half = x.size(-1) / 2;
  if (x.is_cuda() && RotaryCuda(x, cos, sin, out)) return;
  if (!fast) {
    out.copy_(RotaryComposite(x, cos, sin));
    return;
  }
  const at::Tensor cc = cos.contiguous();
  const at::Tensor sc = sin.contiguous();
  const int64_t tokens = x.size(0);
  const int64_t heads = x.size(1);
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float* cp = cc.data_ptr<float>();
  const float* sp = sc.data_ptr<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = cp + t * half;
    const float* s = sp + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      RotateHeadRow(xp + t * x.stride(0) + h * x.stride(1), c, s, half,
                    op + (t * heads + h) * 2 * half);
    }
  }
}

bool RotaryCacheWriteFits(const at::Tensor& like, int64_t tokens, const at::Tensor& cos,
                          const at::Tensor& sin, int64_t heads, int64_t kv_heads, int64_t head_dim,
                          const at::Tensor& key_slots, const at::Tensor& value_slots,
                          const at::Tensor& slots, const at::Tensor& q_out) {
  const auto same = [&](const at::Tensor& t) {
    return t.scalar_type() == like.scalar_type() && t.device() == like.device() &&
           t.is_contiguous();
  };
  return tokens >= 0 && heads > 0 && kv_heads > 0 && head_dim > 0 && head_dim % 2 == 0 &&
         RotaryTablesFit(cos, sin, like, tokens, head_dim) && same(key_slots) &&
         same(value_slots) && key_slots.dim() == 3 && key_slots.size(1) == kv_heads &&
         key_slots.size(2) == head_dim && value_slots.sizes() == key_slots.sizes() && same(q_out) &&
         q_out.dim() == 3 && q_out.size(0) == tokens && q_out.size(1) == heads &&
         q_out.size(2) == head_dim && slots.scalar_type() == at::kLong && slots.dim() == 1 &&
         slots.size(0) == tokens && slots.is_contiguous() && slots.device() == like.device();
}

bool RotaryQkvToCache(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                      int64_t heads, int64_t kv_heads, int64_t head_dim, at::Tensor& key_slots,
                      at::Tensor& value_slots, const at::Tensor& slots, at::Tensor& q_out) {
#ifdef TOPHAT_HAVE_CUDA
  const auto dtype = ToCudaDtype(qkv.scalar_type());
  const int64_t tokens = qkv.dim() == 2 ? qkv.size(0) : -1;
  const bool fits = qkv.is_cuda() && dtype && tokens >= 0 && qkv.stride(1) == 1 &&
                    !qkv.requires_grad() && qkv.size(1) == (heads + 2 * kv_heads) * head_dim &&
                    RotaryCacheWriteFits(qkv, tokens, cos, sin, heads, kv_heads, head_dim,
                                         key_slots, value_slots, slots, q_out);
  if (!fits) return false;
  const RotaryQkvToCacheArgs args{.dtype = *dtype,
                                  .qkv = qkv.data_ptr(),
                                  .row_stride = qkv.stride(0),
                                  .q_out = q_out.data_ptr(),
                                  .key_slots = key_slots.data_ptr(),
                                  .value_slots = value_slots.data_ptr(),
                                  .slots = slots.data_ptr<int64_t>(),
                                  .cos = cos.data_ptr<float>(),
                                  .sin = sin.data_ptr<float>(),
                                  .tokens = tokens,
                                  .heads = static_cast<int>(heads),
                                  .kv_heads = static_cast<int>(kv_heads),
                                  .head_dim = static_cast<int>(head_dim),
                                  .stream = CurrentCudaStream(),
                                  .overlap = OverlapKernelLaunches()};
  std::string error;
  switch (LaunchRotaryQkvToCache(args, &error)) {
    case LaunchResult::kLaunched:
      return true;
    case LaunchResult::kUnsupported:
      return false;
    case LaunchResult::kCudaError:
      TORCH_CHECK(false, "rotary qkv-to-cache kernel: ", error);
  }
#endif
  return false;
}

}  // namespace tophat::kernels
