#include "kernels/rms_norm.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <string>

#ifdef TOPHAT_HAVE_CUDA
#include "kernels/cuda_device.h"
#include "kernels/fused_ops_cuda.cuh"
#endif

namespace tophat::kernels {
namespace {

at::Tensor RmsNormComposite(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // Half types accumulate in float32; float64 keeps its precision.
  at::Tensor xw = x.to(at::promote_types(x.scalar_type(), at::kFloat));
  at::Tensor inv_rms = at::rsqrt(xw.pow(2).mean(-1, /*keepdim=*/true).add_(eps));
  return (xw * inv_rms).to(x.scalar_type()) * weight;
}

// With `residual`: residual[r] += x[r] first and y = norm(residual[r]).
void RmsNormRowsCpu(const float* x, float* residual, const float* w, float* y, int64_t rows,
                    int64_t d, float eps) {
  // Rows are independent; small batches stay on one thread to avoid pool wake-ups.
  at::parallel_for(0, rows, /*grain_size=*/16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * d;
      float* yr = y + r * d;
      if (residual != nullptr) {
        float* rr = residual + r * d;
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) rr[i] += xr[i];
        xr = rr;
      }
      RmsNormRow(xr, w, d, eps, yr);
    }
  });
}

// Whether the fused paths take these inputs: CPU float32, or CUDA float32/16/bf16 in a
// build with the kernels, weight of x's dtype and device, nothing for autograd to record.
bool Fusable(const at::Tensor& x, const at::Tensor& weight) {
  if (x.requires_grad() || weight.requires_grad() || weight.dim() != 1 || x.dim() == 0 ||
      x.size(-1) != weight.size(0) || weight.scalar_type() != x.scalar_type() ||
      weight.device() != x.device()) {
    return false;
  }
  if (x.is_cpu()) return x.scalar_type() == at::kFloat;
#ifdef TOPHAT_HAVE_CUDA
  return x.is_cuda() && ToCudaDtype(x.scalar_type()).has_value();
#else
  return false;
#endif
}

// y = norm(*residual += x) when `residual` is given, else y = norm(x); every tensor
// contiguous and Fusable.
void RunFused(const at::Tensor& x, at::Tensor* residual, const at::Tensor& weight, at::Tensor& y,
              double eps) {
  const int64_t d = x.size(-1);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  if (x.is_cpu()) {
    RmsNormRowsCpu(x.data_ptr<float>(), residual ? residual->data_ptr<float>() : nullptr,
                   weight.data_ptr<float>(), y.data_ptr<float>(), rows, d,
                   static_cast<float>(eps));
    return;
  }
#ifdef TOPHAT_HAVE_CUDA
  const RmsNormArgs args{.dtype = *ToCudaDtype(x.scalar_type()),
                         .x = x.data_ptr(),
                         .residual = residual ? residual->data_ptr() : nullptr,
                         .weight = weight.data_ptr(),
                         .y = y.data_ptr(),
                         .rows = rows,
                         .d = d,
                         .eps = static_cast<float>(eps),
                         .stream = CurrentCudaStream(),
                         .overlap = OverlapKernelLaunches()};
  std::string error;
  TORCH_CHECK(LaunchRmsNorm(args, &error) != LaunchResult::kCudaError, "RMSNorm kernel: ",
              error);
#endif
}

}  // namespace

void RmsNormRow(const float* x, const float* weight, int64_t d, float eps, float* y) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < d; ++i) sum += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(d) + eps);
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) y[i] = x[i] * scale * weight[i];
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (!Fusable(x, weight)) return RmsNormComposite(x, weight, eps);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  RmsNormOut(x, weight, eps, y);
  return y;
}

void RmsNormOut(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out) {
  if (!Fusable(x, weight) || !out.is_contiguous() || out.sizes() != x.sizes() ||
      out.scalar_type() != x.scalar_type() || out.device() != x.device()) {
    out.copy_(RmsNormComposite(x, weight, eps));
    return;
  }
  RunFused(x.contiguous(), nullptr, weight.contiguous(), out, eps);
}

at::Tensor AddRmsNorm(at::Tensor& residual, const at::Tensor& delta, const at::Tensor& weight,
                      double eps) {
  at::Tensor y = at::empty(residual.sizes(),
                           residual.options().memory_format(at::MemoryFormat::Contiguous));
  AddRmsNormOut(residual, delta, weight, eps, y);
  return y;
}

void AddRmsNormOut(at::Tensor& residual, const at::Tensor& delta, const at::Tensor& weight,
                   double eps, at::Tensor& out) {
  const bool fusable = Fusable(residual, weight) && residual.is_contiguous() &&
                       delta.sizes() == residual.sizes() &&
                       delta.scalar_type() == residual.scalar_type() &&
                       delta.device() == residual.device() && !delta.requires_grad() &&
                       out.is_contiguous() && out.sizes() == residual.sizes() &&
                       out.scalar_type() == residual.scalar_type() &&
                       out.device() == residual.device();
  if (!fusable) {
    residual.add_(delta);
    RmsNormOut(residual, weight, eps, out);
    return;
  }
  RunFused(delta.contiguous(), &residual, weight.contiguous(), out, eps);
}

void HeadRmsNormInPlace(at::Tensor& x, const at::Tensor& weight, double eps) {
  const bool fusable = Fusable(x, weight) && weight.is_contiguous() && x.dim() == 3 &&
                       x.stride(2) == 1 && x.stride(1) == x.size(2) &&
                       x.size(1) <= std::numeric_limits<int>::max() &&
                       x.size(2) <= std::numeric_limits<int>::max();
  if (!fusable) {
    x.copy_(RmsNormComposite(x, weight, eps));
    return;
  }
  const int64_t tokens = x.size(0);
  const int64_t heads = x.size(1);
  const int64_t head_dim = x.size(2);
  if (x.is_cpu()) {
    float* base = x.data_ptr<float>();
    const float* w = weight.data_ptr<float>();
    const int64_t row_stride = x.stride(0);
    // A few hundred floats a head: rows of heads share a thread, as RmsNormRowsCpu's rows do.
    at::parallel_for(0, tokens * heads, /*grain_size=*/64, [&](int64_t begin, int64_t end) {
      for (int64_t u = begin; u < end; ++u) {
        float* head = base + (u / heads) * row_stride + (u % heads) * head_dim;
        RmsNormRow(head, w, head_dim, static_cast<float>(eps), head);
      }
    });
    return;
  }
#ifdef TOPHAT_HAVE_CUDA
  const HeadRmsNormArgs args{.dtype = *ToCudaDtype(x.scalar_type()),
                             .x = x.data_ptr(),
                             .row_stride = x.stride(0),
                             .weight = weight.data_ptr(),
                             .tokens = tokens,
                             .heads = static_cast<int>(heads),
                             .head_dim = static_cast<int>(head_dim),
                             .eps = static_cast<float>(eps),
                             .stream = CurrentCudaStream(),
                             .overlap = OverlapKernelLaunches()};
  std::string error;
  const LaunchResult launched = LaunchHeadRmsNorm(args, &error);
  TORCH_CHECK(launched != LaunchResult::kCudaError, "head RMSNorm kernel: ", error);
  if (launched == LaunchResult::kUnsupported) x.copy_(RmsNormComposite(x, weight, eps));
#endif
}

bool HaveCudaKernels() {
#ifdef TOPHAT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace tophat::kernels
