#include "kernels/small_batch_gemm.h"

#include <string>

#ifdef TOPHAT_HAVE_CUDA
#include "kernels/cuda_device.h"
#include "kernels/small_batch_gemm_cuda.cuh"
#endif

namespace tophat::kernels {

bool SmallBatchGemmOut(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                       at::Tensor& out) {
#ifdef TOPHAT_HAVE_CUDA
  const at::ScalarType dtype = x.scalar_type();
  if (!x.is_cuda() || (dtype != at::kBFloat16 && dtype != at::kHalf) || x.dim() != 2 ||
      weight.dim() != 2 || out.dim() != 2 || !weight.is_contiguous() ||
      weight.scalar_type() != dtype || out.scalar_type() != dtype ||
      weight.device() != x.device() || out.device() != x.device() || x.stride(1) != 1 ||
      out.stride(1) != 1 || x.size(1) != weight.size(1) || out.size(0) != x.size(0) ||
      out.size(1) != weight.size(0) || x.requires_grad() || weight.requires_grad()) {
    return false;
  }
  if (bias.defined() && (!bias.is_contiguous() || bias.scalar_type() != dtype ||
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
                                .n = weight.size(0),
                                .k = weight.size(1),
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
  return false;
#endif
}

}  // namespace tophat::kernels
