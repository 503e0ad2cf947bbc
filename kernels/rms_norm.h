// Fused RMSNorm: y = x * rsqrt(mean(x^2) + eps) * weight over the last dimension.
// One pass per row instead of LibTorch's five dispatched ops, which matters at decode time
// when a row is one token and dispatch overhead dominates.
#pragma once

#include <ATen/ATen.h>

namespace tophat::kernels {

// x: [..., D] float32 (any device LibTorch supports); weight: [D]. Falls back to the
// composite LibTorch ops for other dtypes and devices, and when autograd must record it.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// True when this build carries the CUDA kernels (a toolkit was found at configure time).
bool HaveCudaKernels();

}  // namespace tophat::kernels
