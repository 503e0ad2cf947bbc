#include "kernels/small_batch_gemm.h"

#include <string>

#ifdef TOPHAT_HAVE_CUDA
#include "kernels/cuda_device.h"
#include "kernels/small_batch_gemm_cuda.cuh"
#endif

namespace tophat::kernels {

namespace {

// Both forms: `swiglu` with a [2 * out columns, K] weight and no bias.
bool Launch(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::Tensor& out,
            bool swiglu) {
#ifdef TOPHAT_HAVE_CUDA
  const at::ScalarType dtype = x.scalar_type();
  if (x.dim() != 2 || weight.dim() != 2 || out.dim() != 2) return false;
  const int64_t weight_rows = swiglu ? 2 * out.size(1) : out.size(1);
  if (!x.is_cuda() || (dtype != at::kBFloat16 && dtype != at::kHalf) || !weight.is_contiguous() ||
      weight.scalar_type() != dtype || out.scalar_type() != dtype ||
      weight.device() != x.device() || out.device() != x.device() || x.stride(1) != 1 ||
      out.stride(1) != 1 || x.size(1) != weight.size(1) || out.size(0) != x.size(0) ||
      weight.size(0) != weight_rows || x.requires_grad() || weight.requires_grad()) {
    return false;
  }
  if (bias.defined() && (swiglu || !bias.is_contiguous() || bias.scalar_type() != dtype ||
                         bias.device() != x.device() || bias.numel() != weight.size(0))) {
    return false;
  }
  const SmallBatchGemmArgs args{.dtype = *ToCudaDtype(dtype),
                                .x = x.data_ptr(),
                                .ldx = x.stride(0),
                                .weight = weight.data_ptr(),
                                .bias = bias.defined() ? bias.data_ptr() : nullptr,
                                .out = out.data_ptr(),
                                .ldo = out.stride(0),
                                .rows = x.size(0),
                                .n = out.size(1),
                                .k = weight.size(1),
                                .swiglu = swiglu,
                                .stream = CurrentCudaStream(),
                                .overlap = OverlapKernelLaunches()};
  std::string error;
  const LaunchResult result = LaunchSmallBatchGemm(args, &error);
  TORCH_CHECK(result != LaunchResult::kCudaError, "small-batch GEMM kernel: ", error);
  return result == LaunchResult::kLaunched;
#else
  (void)x;
  (void)weight;
  (void)bias;
  (void)out;
  (void)swiglu;
  return false;
#endif
}

}  // namespace

bool SmallBatchGemmOut(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                       at::Tensor& out) {
  return Launch(x, weight, bias, out, /*swiglu=*/false);
}

bool SmallBatchGemmSwiGluOut(const at::Tensor& x, const at::Tensor& gate_up, at::Tensor& out) {
  return Launch(x, gate_up, {}, out, /*swiglu=*/true);
}

}  // namespace tophat::kernels
