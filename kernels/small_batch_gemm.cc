#include "kernels/small_batch_gemm.h"

#include <optional>
#include <string>

#ifdef TOPHAT_HAVE_CUDA
#include "kernels/cuda_device.h"
#include "kernels/rope.h"
#include "kernels/small_batch_gemm_cuda.cuh"
#endif

namespace tophat::kernels {

namespace {

#ifdef TOPHAT_HAVE_CUDA
// x [rows, K] and weight [weight_rows, K] as the kernel takes them (bias [weight_rows] or
// undefined), and the arguments for them with `out` [rows, out_columns] where there is one.
std::optional<SmallBatchGemmArgs> GemmArgs(const at::Tensor& x, const at::Tensor& weight,
                                           const at::Tensor& bias, int64_t weight_rows) {
  const at::ScalarType dtype = x.scalar_type();
  if (x.dim() != 2 || weight.dim() != 2 || !x.is_cuda() ||
      (dtype != at::kBFloat16 && dtype != at::kHalf) || !weight.is_contiguous() ||
      weight.scalar_type() != dtype || weight.device() != x.device() || x.stride(1) != 1 ||
      x.size(1) != weight.size(1) || weight.size(0) != weight_rows || x.requires_grad() ||
      weight.requires_grad()) {
    return std::nullopt;
  }
  if (bias.defined() && (!bias.is_contiguous() || bias.scalar_type() != dtype ||
                         bias.device() != x.device() || bias.numel() != weight_rows)) {
    return std::nullopt;
  }
  return SmallBatchGemmArgs{.dtype = *ToCudaDtype(dtype),
                            .x = x.data_ptr(),
                            .ldx = x.stride(0),
                            .weight = weight.data_ptr(),
                            .bias = bias.defined() ? bias.data_ptr() : nullptr,
                            .rows = x.size(0),
                            .n = weight_rows,
                            .k = weight.size(1),
                            .stream = CurrentCudaStream(),
                            .overlap = OverlapKernelLaunches()};
}

bool OutFits(const at::Tensor& x, const at::Tensor& out) {
  return out.dim() == 2 && out.scalar_type() == x.scalar_type() && out.device() == x.device() &&
         out.stride(1) == 1 && out.size(0) == x.size(0);
}

bool Launch(const SmallBatchGemmArgs& args) {
  std::string error;
  const LaunchResult result = LaunchSmallBatchGemm(args, &error);
  TORCH_CHECK(result != LaunchResult::kCudaError, "small-batch GEMM kernel: ", error);
  return result == LaunchResult::kLaunched;
}
#endif

}  // namespace

bool SmallBatchGemmOut(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                       at::Tensor& out) {
#ifdef TOPHAT_HAVE_CUDA
  if (!OutFits(x, out)) return false;
  std::optional<SmallBatchGemmArgs> args = GemmArgs(x, weight, bias, out.size(1));
  if (!args) return false;
  args->out = out.data_ptr();
  args->ldo = out.stride(0);
  return Launch(*args);
#else
  (void)x;
  (void)weight;
  (void)bias;
  (void)out;
  return false;
#endif
}

bool SmallBatchGemmSwiGluOut(const at::Tensor& x, const at::Tensor& gate_up, at::Tensor& out) {
#ifdef TOPHAT_HAVE_CUDA
  if (!OutFits(x, out)) return false;
  std::optional<SmallBatchGemmArgs> args = GemmArgs(x, gate_up, {}, 2 * out.size(1));
  if (!args) return false;
  args->out = out.data_ptr();
  args->ldo = out.stride(0);
  args->n = out.size(1);
  args->form = SmallBatchGemmForm::kSwiGlu;
  return Launch(*args);
#else
  (void)x;
  (void)gate_up;
  (void)out;
  return false;
#endif
}

bool SmallBatchGemmRotaryQkvToCache(const at::Tensor& x, const at::Tensor& qkv_weight,
                                    const at::Tensor& qkv_bias, const at::Tensor& cos,
                                    const at::Tensor& sin, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, at::Tensor& key_slots,
                                    at::Tensor& value_slots, const at::Tensor& slots,
                                    at::Tensor& q_out) {
#ifdef TOPHAT_HAVE_CUDA
  const int64_t tokens = x.dim() == 2 ? x.size(0) : -1;
  if (tokens < 1 || !RotaryCacheWriteFits(x, tokens, cos, sin, heads, kv_heads, head_dim, key_slots,
                                          value_slots, slots, q_out)) {
    return false;
  }
  std::optional<SmallBatchGemmArgs> args =
      GemmArgs(x, qkv_weight, qkv_bias, (heads + 2 * kv_heads) * head_dim);
  if (!args) return false;
  args->form = SmallBatchGemmForm::kRotaryQkv;
  args->rotary = SmallBatchGemmRotary{.q_out = q_out.data_ptr(),
                                      .key_slots = key_slots.data_ptr(),
                                      .value_slots = value_slots.data_ptr(),
                                      .slots = slots.data_ptr<int64_t>(),
                                      .cos = cos.data_ptr<float>(),
                                      .sin = sin.data_ptr<float>(),
                                      .heads = static_cast<int>(heads),
                                      .kv_heads = static_cast<int>(kv_heads),
                                      .head_dim = static_cast<int>(head_dim)};
  return Launch(*args);
#else
  (void)x;
  (void)qkv_weight;
  (void)qkv_bias;
  (void)cos;
  (void)sin;
  (void)heads;
  (void)kv_heads;
  (void)head_dim;
  (void)key_slots;
  (void)value_slots;
  (void)slots;
  (void)q_out;
  return false;
#endif
}

}  // namespace tophat::kernels
