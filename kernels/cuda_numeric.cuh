// Device-side conversions between the storage dtypes and the float32 the kernels compute
// in. For .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tophat::kernels {

__device__ inline float ToFloat(float v) { return v; }
__device__ inline float ToFloat(__half v) { return __half2float(v); }
__device__ inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ inline T FromFloat(float v);
template <>
__device__ inline float FromFloat<float>(float v) { return v; }
template <>
__device__ inline __half FromFloat<__half>(float v) { return __float2half(v); }
template <>
__device__ inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

// SwiGLU of one gate and up value, silu(gate) * up: one expression for every kernel that
// computes it (the SwiGLU kernel, the small-batch GEMM's fused form), so that they agree to
// the bit.
__device__ inline float SwiGluOf(float gate, float up) {
  return gate / (1.0f + __expf(-gate)) * up;
}

// Rotary embedding of one pair (x1 at i, x2 at i + head_dim / 2; rotate-half layout):
// x1 c - x2 s and x2 c + x1 s. Each product is rounded before the sum (no fused
// multiply-add, which the compiler would otherwise choose per call site), so that every
// kernel that rotates (the rotary kernels, the small-batch GEMM's rotary form) gets the same
// bits.
__device__ inline float RotatedFirst(float x1, float x2, float c, float s) {
  return __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
}
__device__ inline float RotatedSecond(float x1, float x2, float c, float s) {
  return __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

}  // namespace tophat::kernels
