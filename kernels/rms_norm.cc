#include "kernels/rms_norm.h"

#include <ATen/Parallel.h>

#include <cmath>

#ifdef TOPHAT_HAVE_CUDA
#include "kernels/rms_norm_cuda.cuh"
#endif

namespace tophat::kernels {
namespace {

at::Tensor RmsNormComposite(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // Half types accumulate in float32; float64 keeps its precision.
  at::Tensor xw = x.to(at::promote_types(x.scalar_type(), at::kFloat));
  at::Tensor inv_rms = at::rsqrt(xw.pow(2).mean(-1, /*keepdim=*/true).add_(eps));
  return (xw * inv_rms).to(x.scalar_type()) * weight;
}

void RmsNormRowsCpu(const float* x, const float* w, float* y, int64_t rows, int64_t d,
                    float eps) {
  // Rows are independent; small batches stay on one thread to avoid pool wake-ups.
  at::parallel_for(0, rows, /*grain_size=*/16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * d;
      float* yr = y + r * d;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < d; ++i) sum += xr[i] * xr[i];
      const float scale = 1.0f / std::sqrt(sum / static_cast<float>(d) + eps);
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * scale * w[i];
    }
  });
}

}  // namespace

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const bool fast_dtype = x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat;
  // Training needs autograd, which only the composite ops record.
  const bool needs_grad = x.requires_grad() || weight.requires_grad();
  if (!fast_dtype || needs_grad || weight.dim() != 1 || x.size(-1) != weight.size(0)) {
    return RmsNormComposite(x, weight, eps);
  }
  at::Tensor xc = x.contiguous();
  at::Tensor wc = weight.contiguous();
  at::Tensor y = at::empty_like(xc);
  const int64_t d = xc.size(-1);
  const int64_t rows = d == 0 ? 0 : xc.numel() / d;
  if (xc.is_cpu()) {
    RmsNormRowsCpu(xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), rows, d,
                   static_cast<float>(eps));
    return y;
  }
#ifdef TOPHAT_HAVE_CUDA
  if (xc.is_cuda()) {
    LaunchRmsNormF32(xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), rows, d,
                     static_cast<float>(eps), /*stream=*/nullptr);
    return y;
  }
#endif
  return RmsNormComposite(x, weight, eps);
}

bool HaveCudaKernels() {
#ifdef TOPHAT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace tophat::kernels
