// Fused RMSNorm: y = x * rsqrt(mean(x^2) + eps) * weight over the last dimension.
// One pass per row instead of LibTorch's five dispatched ops, which matters at decode time
// when a row is one token and dispatch overhead dominates.
#pragma once

#include <ATen/ATen.h>

namespace tophat::kernels {

// x: [..., D]; weight: [D]. Fused for float32 on the CPU, and for float32, float16 and
// bfloat16 on CUDA (weight of x's dtype); the composite LibTorch ops otherwise, and when
// autograd must record it.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// The residual add of a decoder layer fused with the norm after it: residual += delta (in
// place, rounded to residual's dtype), then returns RmsNorm(residual, weight, eps).
// residual: [..., D] contiguous; delta: residual's shape, dtype and device. Same fused
// cases as RmsNorm; otherwise residual.add_(delta) and the composite norm.
at::Tensor AddRmsNorm(at::Tensor& residual, const at::Tensor& delta, const at::Tensor& weight,
                      double eps);

// The same into `out` (x's shape, dtype and device, contiguous), allocating nothing on the
// fused paths; the decode step writes into buffers it allocated once. `out` must not alias
// x (RmsNormOut) or residual/delta (AddRmsNormOut).
void RmsNormOut(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out);
void AddRmsNormOut(at::Tensor& residual, const at::Tensor& delta, const at::Tensor& weight,
                   double eps, at::Tensor& out);

// Each head's RMSNorm in place (Qwen3's q_norm and k_norm before rotary): x [tokens, heads,
// head_dim] with head_dim contiguous and the heads of a token at stride head_dim (the query or
// key part of a qkv row, viewed); weight [head_dim]. Fused (allocating nothing) for float32 on
// the CPU and the CUDA dtypes on a GPU; the composite ops, copied back, otherwise.
void HeadRmsNormInPlace(at::Tensor& x, const at::Tensor& weight, double eps);

// One row of d float32 values: the arithmetic of the CPU paths above, for callers that
// work row by row (kernels/decode_step.h gets the same numbers as RmsNormOut). y may be x.
void RmsNormRow(const float* x, const float* weight, int64_t d, float eps, float* y);

// True when this build carries the CUDA kernels (a toolkit was found at configure time).
bool HaveCudaKernels();

}  // namespace tophat::kernels
